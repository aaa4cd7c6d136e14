#include "common/cuda/graph.h"

#include "common/cuda/cuda_check.h"

namespace lamina::cuda {

absl::StatusOr<Graph> Graph::Capture(cudaStream_t stream, absl::FunctionRef<absl::Status()> work) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status queued = work();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> owned(graph, &cudaGraphDestroy);
  if (!queued.ok()) {
    cudaGetLastError();  // clears the capture error that the failure of `work` caused
    return queued;
  }
  LAMINA_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  Graph g;
  g.exec_.reset(exec);
  return g;
}

absl::Status Graph::Launch(cudaStream_t stream) const {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_.get(), stream));
  return absl::OkStatus();
}

}  // namespace lamina::cuda
