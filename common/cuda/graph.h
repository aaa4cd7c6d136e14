// A CUDA graph: the work a function queues on a stream, captured once and instantiated, then
// launched as one unit. Capture uses thread-local mode, so other threads may keep using CUDA
// meanwhile; the captured work must not synchronise or allocate. A graph holds the pointers it
// was captured with: rebuild it when a buffer it uses is reallocated.
// Thread-compatible; move-only.
#ifndef LAMINA_COMMON_CUDA_GRAPH_H_
#define LAMINA_COMMON_CUDA_GRAPH_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace lamina::cuda {

class Graph {
 public:
  // Captures what `work` queues on `stream` (nothing runs). A failure of `work` or of the capture
  // is returned, and the stream is left out of capture mode.
  static absl::StatusOr<Graph> Capture(cudaStream_t stream, absl::FunctionRef<absl::Status()> work);

  // Queues the captured work on `stream`.
  absl::Status Launch(cudaStream_t stream) const;

 private:
  struct DestroyExec {
    void operator()(cudaGraphExec_t e) const { cudaGraphExecDestroy(e); }
  };
  std::unique_ptr<CUgraphExec_st, DestroyExec> exec_;
};

}  // namespace lamina::cuda

#endif  // LAMINA_COMMON_CUDA_GRAPH_H_
