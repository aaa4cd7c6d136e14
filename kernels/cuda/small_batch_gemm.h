// out = x · Wᵀ for a handful of rows (m ≤ kSmallBatchRows): the decode-step GEMMs at small batch,
// which only stream the weights once. cuBLAS reaches about half the read rate on the narrower of
// them at m = 1 (PERFORMANCE.md); here each warp owns one output column and streams its weight
// row with 16-byte loads, four in flight per lane, accumulating every x row in float32.
// Same contract as Gemm::Run (bf16 in, float32 out, optional bias, optional accumulate).
// Thread-safe; queues work on `stream`.
#ifndef LAMINA_KERNELS_CUDA_SMALL_BATCH_GEMM_H_
#define LAMINA_KERNELS_CUDA_SMALL_BATCH_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lamina::kernels::cuda {

// Up to this many rows the small-batch kernel beats cuBLAS; past a few it falls behind, as the x
// reads per weight byte grow with m (tests/bench/RESULTS.md).
inline constexpr int64_t kSmallBatchRows = 2;

// True when SmallBatchGemm takes these operands: 1 ≤ m ≤ kSmallBatchRows, k a multiple of 8 and
// x and w 16-byte aligned (so that every row is).
bool SmallBatchGemmApplies(const void* x, const __nv_bfloat16* w, int64_t m, int64_t k);

// out[m, n] = (accumulate ? out : 0) + x[m, k] · w[n, k]ᵀ (+ bias[n]). InvalidArgument when
// SmallBatchGemmApplies is false.
absl::Status SmallBatchGemm(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* bias, float* out, int64_t m,
                            int64_t n, int64_t k, bool accumulate, cudaStream_t stream);

// The same with x in float32, each value rounded to bf16 as it is read: the bits of ToBf16 then
// SmallBatchGemm, in one launch.
absl::Status SmallBatchGemmRoundingX(const float* x, const __nv_bfloat16* w, const float* bias, float* out,
                                     int64_t m, int64_t n, int64_t k, bool accumulate, cudaStream_t stream);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_SMALL_BATCH_GEMM_H_
