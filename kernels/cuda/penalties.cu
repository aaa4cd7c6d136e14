#include "kernels/cuda/penalties.h"

#include "common/cuda/cuda_check.h"
#include "kernels/cuda/chaining.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ApplyPenaltiesKernel(float* logits, const DevicePenaltyEdit* edits, float* saved, int64_t count,
                                     int64_t vocab) {
  StartChained();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const DevicePenaltyEdit edit = edits[i];
  float& logit = logits[edit.row * vocab + edit.token];
  const float old = logit;
  saved[i] = old;
  // As EditLogit in compute_node/sampling/penalties.h: IEEE division and multiplication.
  logit = (old > 0.0f ? __fdiv_rn(old, edit.divisor) : __fmul_rn(old, edit.divisor)) - edit.subtract;
}

__global__ void RestoreLogitsKernel(float* logits, const DevicePenaltyEdit* edits, const float* saved, int64_t count,
                                    int64_t vocab) {
  StartChained();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  logits[edits[i].row * vocab + edits[i].token] = saved[i];
}

unsigned Blocks(int64_t count) { return static_cast<unsigned>((count + kThreads - 1) / kThreads); }

}  // namespace

absl::Status ApplyPenalties(float* logits, const DevicePenaltyEdit* edits, float* saved, int64_t count, int64_t vocab,
                            cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(ApplyPenaltiesKernel, dim3(Blocks(count)), dim3(kThreads), 0, stream,
                                            logits, edits, saved, count, vocab));
  return absl::OkStatus();
}

absl::Status RestoreLogits(float* logits, const DevicePenaltyEdit* edits, const float* saved, int64_t count,
                           int64_t vocab, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(RestoreLogitsKernel, dim3(Blocks(count)), dim3(kThreads), 0, stream, logits,
                                            edits, saved, count, vocab));
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
