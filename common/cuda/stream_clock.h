// When a stream's queued work computes, as against exchanging with other nodes: marks queued on
// the stream between its kernels (CUDA events), each saying whether what follows computes, read
// once the stream has done the work. What a GPU compute node's busy fraction counts: the slices,
// not the sends and flag waits between them, which spin for as long as a peer takes.
//
// Times come back on the host clock: the last mark of a stretch is taken to have passed when the
// host saw the stream done (`done_at`), and the others are placed before it by the device's own
// timing, so the intervals of several streams (a node's lanes) can be merged (IntervalUnion).
// Its events are made up front (Create): making one may wait for the whole device, which never
// comes to rest while a data plane's waits spin on another node's progress. A stretch needing more
// marks than that is left out.
// Thread-compatible: one stream's marks at a time.
#ifndef LAMINA_COMMON_CUDA_STREAM_CLOCK_H_
#define LAMINA_COMMON_CUDA_STREAM_CLOCK_H_

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cuda/device_buffer.h"

namespace lamina::cuda {

class StreamClock {
 public:
  using Interval = std::pair<absl::Time, absl::Time>;

  StreamClock() = default;
  // Room for `marks` marks between two Takes, on the current device.
  static absl::StatusOr<StreamClock> Create(size_t marks);

  // Queues a mark on `stream`: computing from here on, or not. A mark that does not change the
  // state is left out; one beyond the room made is dropped, and the stretch with it.
  absl::Status Mark(bool computing, cudaStream_t stream);
  // Call once the stream has done everything marked, at host time `done_at`, the last mark being
  // a stop: the computing intervals since the last call, oldest first (none when marks were
  // dropped). FailedPrecondition while computing. Clears the marks either way.
  absl::StatusOr<std::vector<Interval>> Take(absl::Time done_at);
  // Forgets the marks (their work was abandoned).
  void Clear();

 private:
  std::vector<Event> events_;  // a pool; the first `marks_` are queued, alternately start, stop
  size_t marks_ = 0;
  bool computing_ = false;
  bool dropped_ = false;  // a mark found no room since the last Take
};

}  // namespace lamina::cuda

#endif  // LAMINA_COMMON_CUDA_STREAM_CLOCK_H_
