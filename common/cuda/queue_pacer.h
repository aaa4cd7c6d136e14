// Keeps a thread from queuing work too far ahead of a GPU. Each CUDA stream holds about a thousand
// launches that have not started; the launch after that blocks inside the driver until the GPU
// starts one, and while it
// does, other threads' CUDA calls that take the driver's lock (cudaMallocHost among them) block
// too. Behind a wait for another node (the data planes, the hand-overs) the GPU starts nothing
// until that node moves, and it may be waiting on one of those blocked threads (a prefill's k/v
// stores on one lane once held a memory node's other lanes so until their waits timed out).
//
// The caller marks the end of each unit of work it queues (a layer, a chunk: a few launches), and
// Paced then holds the thread until the unit `most_units` back has finished on the GPU, so at most
// `most_units` units are ever queued and unstarted. Waiting here blocks only this thread (it
// polls, sleeping between polls). Units may go to several streams; the bound counts them all.
// The marks are events without timing, which take no room in a stream's queue. Events with
// timing take a launch's room each, and blocking-sync events come from a small pool (56 records
// fit behind a wait), so neither would do.
// Its events are made up front (Create): a thread mid-step makes none.
// Thread-compatible.
#ifndef LAMINA_COMMON_CUDA_QUEUE_PACER_H_
#define LAMINA_COMMON_CUDA_QUEUE_PACER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace lamina::cuda {

class QueuePacer {
 public:
  QueuePacer() = default;
  // At most `most_units` (>= 1) units queued ahead, on the current device.
  static absl::StatusOr<QueuePacer> Create(int most_units);

  // Call after queuing a unit's work on `stream`: waits for the unit `most_units` back to finish,
  // then marks this one's end. The error of a failed wait (a fault on the device).
  absl::Status Paced(cudaStream_t stream);
  int most_units() const { return static_cast<int>(ends_.size()); }

 private:
  std::vector<Event> ends_;  // a ring: the ends of the last most_units units
  int64_t units_ = 0;        // units marked so far
};

}  // namespace lamina::cuda

#endif  // LAMINA_COMMON_CUDA_QUEUE_PACER_H_
