// The compute slices' matrix products through cuBLASLt: out = x · Wᵀ with x and W in bf16,
// float32 accumulation and output, and the bias or the residual add fused into the epilogue.
// A plan (descriptors and the chosen algorithm) is made once per shape and reused. Up to
// kSmallBatchRows rows go to SmallBatchGemm instead (small_batch_gemm.h), which streams the
// weights closer to the read rate than cuBLAS does there.
// Thread-compatible: one caller at a time per Gemm.
#ifndef LAMINA_KERNELS_CUDA_GEMM_H_
#define LAMINA_KERNELS_CUDA_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

struct cublasLtContext;

namespace lamina::kernels::cuda {

using bf16 = __nv_bfloat16;

class Gemm {
 public:
  static absl::StatusOr<std::unique_ptr<Gemm>> Create();
  ~Gemm();

  // out[m, n] = (accumulate ? out : 0) + x[m, k] · w[n, k]ᵀ (+ bias[n]).
  absl::Status Run(const bf16* x, const bf16* w, const float* bias, float* out, int64_t m, int64_t n, int64_t k,
                   bool accumulate, cudaStream_t stream);

  // false: every shape through cuBLASLt (for benchmarks that compare the two).
  void set_use_small_batch(bool use) { use_small_batch_ = use; }

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool>;  // m, n, k, bias, accumulate
  Gemm() = default;
  absl::StatusOr<Plan*> PlanFor(const Key& key);

  cublasLtContext* handle_ = nullptr;
  ::lamina::cuda::DeviceBuffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  bool use_small_batch_ = true;
};

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_GEMM_H_
