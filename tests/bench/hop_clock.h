// A benchmark's hop clocks: the words in which a device link's send and receive kernels stamp each
// layer's round trip on the sending GPU's clock (kernels/cuda/data_plane.h, "Hop clocks";
// ComputeLinkEnd::SetHopClock), and the round trips read back from them.
// Thread-compatible; move-only.
#ifndef LAMINA_TESTS_BENCH_HOP_CLOCK_H_
#define LAMINA_TESTS_BENCH_HOP_CLOCK_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace lamina::bench {

class HopClock {
 public:
  // Words for `layers` layers ([layers, 2]: a layer's send stamp, then its receive stamp) on the
  // current GPU.
  static absl::StatusOr<HopClock> Create(int64_t layers);

  uint64_t* words() { return words_.as<uint64_t>(); }
  uint64_t* sent_at(int64_t layer) { return words() + 2 * layer; }
  uint64_t* back_at(int64_t layer) { return words() + 2 * layer + 1; }

  // Readies every layer's words for a step (the send's to UINT64_MAX, the receive's to 0).
  absl::Status Reset();

  // The round trips of layers [first, layers) summed, in ns, and their count; (0, 0) when one of
  // them was not timed. Call once the step's work is done.
  absl::StatusOr<std::pair<double, int64_t>> Sum(int64_t first);

  // The greatest common divisor of every round trip summed so far, in ns: the clock's step where it
  // ticks coarser than a nanosecond (0: none yet).
  uint64_t step_ns() const { return step_ns_; }

 private:
  cuda::DeviceBuffer words_;
  std::vector<uint64_t> host_;
  uint64_t step_ns_ = 0;
};

}  // namespace lamina::bench

#endif  // LAMINA_TESTS_BENCH_HOP_CLOCK_H_
