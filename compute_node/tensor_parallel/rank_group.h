// The collectives of a tensor-parallel group's ranks (one process each, topology.h's
// `tensor_parallel`): rank 0 listens on its data port and every other rank connects to it. A sum
// goes to rank 0, which adds the ranks' parts in rank order and sends the total back, so every rank
// holds the same bits; a gather concatenates the ranks' parts in rank order. Every rank must make
// the same calls in the same order with the same sizes (the same plans guarantee it). A rank that
// dies or stalls fails the others' calls (Unavailable, or DeadlineExceeded after `timeout`).
// Steps: each rank brackets a step's calls with BeginStep (the plan's step id), and a rank whose
// step fails calls AbandonStep, which ends the others' calls of that step at once (Aborted) rather
// than at the timeout. Parts and answers carry their step and call, so what an abandoned step left
// on the connections is skipped and never answers a later call.
// Thread-compatible: one call at a time.
#ifndef LAMINA_COMPUTE_NODE_TENSOR_PARALLEL_RANK_GROUP_H_
#define LAMINA_COMPUTE_NODE_TENSOR_PARALLEL_RANK_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/transport/transport.h"

namespace lamina {

class RankGroup {
 public:
  // Rank `rank` of `size` joins: rank 0 listens on `leader_address` and waits for the others; the
  // others connect to it. Both until `deadline`. `transport` must outlive the group.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Join(Transport* transport, int rank, int size,
                                                         const std::string& leader_address, absl::Duration timeout,
                                                         absl::Time deadline);

  int rank() const { return rank_; }
  int size() const { return size_; }

  // The step whose collectives follow: the plan's id, the same on every rank and growing.
  void BeginStep(uint64_t step);
  // This rank's step failed: the other ranks' calls of it end (Aborted), now or when they come.
  void AbandonStep();

  // Every rank's `data` becomes the sum over ranks (rank 0's part first, then 1, 2, ...).
  absl::Status AllReduceSum(absl::Span<float> data);
  // `all` [size × mine.size()] becomes every rank's `mine`, rank 0's first.
  absl::Status AllGather(absl::Span<const float> mine, absl::Span<float> all);

 private:
  RankGroup(int rank, int size, absl::Duration timeout) : rank_(rank), size_(size), timeout_(timeout) {}
  // Rank 0 collects each other rank's part of this call into parts_[r - 1].
  absl::Status Collect(size_t bytes);
  absl::Status SendToAll(const float* data, size_t count);
  // Ranks > 0: sends this call's part and waits for rank 0's answer into reply_.
  absl::Status Exchange(const void* data, size_t bytes);

  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  uint64_t step_ = 0;  // BeginStep's
  uint32_t call_ = 0;  // the step's calls done
  std::unique_ptr<Listener> listener_;                   // rank 0
  std::vector<std::unique_ptr<Connection>> peers_;       // rank 0: ranks 1..size-1; others: rank 0
  std::vector<std::vector<uint8_t>> parts_;              // rank 0: what each other rank sent
  std::vector<uint8_t> reply_;                           // other ranks: rank 0's answer
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_TENSOR_PARALLEL_RANK_GROUP_H_
