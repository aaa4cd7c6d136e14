#include "kernels/cuda/small_batch_gemm.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/packed.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;   // columns per block
// 16-byte weight loads per lane before the arithmetic. Four rather than eight: the kernel then
// needs about 40 registers, not 56, so more warps fit an SM, and the decode step at batch 1 was
// no slower (lamina-bench-e2e, tests/bench/RESULTS.md).
constexpr int kInFlight = 4;

// The 8 values of x's 16-byte chunk `c` (8 bf16), as floats.
__device__ __forceinline__ void LoadX(const bf16* x, int64_t c, float (&v)[8]) {
  Unpack8(__ldg(reinterpret_cast<const uint4*>(x) + c), v);
}

// The same from float32 x, each value rounded to bf16 as ToBf16 rounds it.
__device__ __forceinline__ void LoadX(const float* x, int64_t c, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(x) + 2 * c);
  const float4 b = __ldg(reinterpret_cast<const float4*>(x) + 2 * c + 1);
  const float raw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(__float2bfloat16(raw[i]));
}

// acc[r] += the 8 products of one 16-byte chunk of the weight row with x row r's chunk `c`.
template <int M, typename X>
__device__ __forceinline__ void AccumulateChunk(const uint4& w_chunk, const X* x, int64_t k, int64_t c,
                                                float (&acc)[M]) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w_chunk);
  float2 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = __bfloat1622float2(w2[i]);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    float xv[8];
    LoadX(x + r * k, c, xv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[r] = fmaf(w[i].x, xv[2 * i], acc[r]);
      acc[r] = fmaf(w[i].y, xv[2 * i + 1], acc[r]);
    }
  }
}

template <int M, typename X>
__global__ void __launch_bounds__(kWarps * 32) SmallBatchGemmKernel(const X* x, const bf16* w, const float* bias,
                                                                    float* out, int64_t n, int64_t k,
                                                                    bool accumulate) {
  // Chained (chaining.cuh). Loading weights before the wait, into registers or L2, made the step
  // slower: it delays the loads that x is ready for.
  StartChained();
  const int lane = threadIdx.x % 32;
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (column >= n) return;
  // The weights are read once: stream them past the caches (x stays cached for the other warps).
  const uint4* row = reinterpret_cast<const uint4*>(w + column * k);
  const int64_t chunks = k / 8;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.f;
  int64_t c = lane;
  for (; c + 32 * (kInFlight - 1) < chunks; c += 32 * kInFlight) {
    uint4 loaded[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) loaded[u] = __ldcs(row + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) AccumulateChunk<M, X>(loaded[u], x, k, c + 32 * u, acc);
  }
  for (; c < chunks; c += 32) AccumulateChunk<M, X>(__ldcs(row + c), x, k, c, acc);
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = WarpSum(acc[r]);
  if (lane == 0) {
    const float b = bias ? bias[column] : 0.f;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float* o = out + r * n + column;
      *o = (accumulate ? *o : 0.f) + acc[r] + b;
    }
  }
}

template <int M, typename X>
cudaError_t Launch(const X* x, const bf16* w, const float* bias, float* out, int64_t n, int64_t k,
                   bool accumulate, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((n + kWarps - 1) / kWarps);
  return LaunchChained(SmallBatchGemmKernel<M, X>, dim3(blocks), dim3(kWarps * 32), 0, stream, x, w, bias, out, n, k,
                       accumulate);
}

}  // namespace

bool SmallBatchGemmApplies(const void* x, const bf16* w, int64_t m, int64_t k) {
  return m >= 1 && m <= kSmallBatchRows && k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

namespace {

template <typename X>
absl::Status Run(const X* x, const bf16* w, const float* bias, float* out, int64_t m, int64_t n, int64_t k,
                 bool accumulate, cudaStream_t stream) {
  if (!SmallBatchGemmApplies(x, w, m, k)) {
    return absl::InvalidArgumentError(absl::StrCat("SmallBatchGemm takes 1..", kSmallBatchRows,
                                                   " rows, k a multiple of 8 and 16-byte aligned operands; got m=", m,
                                                   " k=", k));
  }
  if (n == 0) return absl::OkStatus();
  static_assert(kSmallBatchRows == 2, "instantiate a kernel for every row count taken");
  LAMINA_CUDA_RETURN_IF_ERROR(m == 1 ? Launch<1>(x, w, bias, out, n, k, accumulate, stream)
                                     : Launch<2>(x, w, bias, out, n, k, accumulate, stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status SmallBatchGemm(const bf16* x, const bf16* w, const float* bias, float* out, int64_t m, int64_t n,
                            int64_t k, bool accumulate, cudaStream_t stream) {
  return Run(x, w, bias, out, m, n, k, accumulate, stream);
}

absl::Status SmallBatchGemmRoundingX(const float* x, const bf16* w, const float* bias, float* out, int64_t m,
                                     int64_t n, int64_t k, bool accumulate, cudaStream_t stream) {
  return Run(x, w, bias, out, m, n, k, accumulate, stream);
}

}  // namespace lamina::kernels::cuda
