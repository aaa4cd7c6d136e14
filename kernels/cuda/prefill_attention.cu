// Causal prefill attention, FlashAttention-2 style (float32 arithmetic on the CUDA cores):
//  - a block owns 16 query rows of one head (4 warps × 4 rows) and keeps them in shared memory;
//  - it walks the keys in tiles of 32 that it stages in shared memory (K padded by one column so
//    the lanes' row reads fall in distinct banks);
//  - lane j scores key j of the tile against the warp's 4 rows; the online softmax keeps a running
//    max and sum per row; each lane accumulates the output dims lane, lane + 32, ...
// Work is split over the sequence (query tiles × heads across blocks) and across warps (rows).
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;
constexpr int kTile = 32;

template <int kDim>
__global__ void __launch_bounds__(kWarps * 32) PrefillKernel(
    const float* __restrict__ q, int64_t q_stride, const float* __restrict__ k, const float* __restrict__ v,
    int64_t kv_stride, float* __restrict__ out, int64_t out_stride, int num_tokens, int group, int sliding_window,
    float scale) {
  constexpr int kPerLane = kDim >= 32 ? kDim / 32 : 1;
  __shared__ float qs[kRows][kDim];
  __shared__ float ks[kTile][kDim + 1];
  __shared__ float vs[kTile][kDim];
  const int head = blockIdx.y;
  const int kv_head = head / group;
  const int row0 = blockIdx.x * kRows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  for (int i = threadIdx.x; i < kRows * kDim; i += blockDim.x) {
    const int r = i / kDim;
    const int d = i % kDim;
    const int t = row0 + r;
    qs[r][d] = t < num_tokens ? q[t * q_stride + head * kDim + d] * scale : 0.f;
  }

  float run_max[kRowsPerWarp];
  float run_sum[kRowsPerWarp];
  float acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    run_max[i] = -INFINITY;
    run_sum[i] = 0.f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) acc[i][j] = 0.f;
  }

  const int last_row = min(num_tokens, row0 + kRows) - 1;
  int first_key = 0;
  if (sliding_window > 0) first_key = max(0, row0 - sliding_window + 1);
  for (int tile = first_key / kTile * kTile; tile <= last_row; tile += kTile) {
    __syncthreads();
    for (int i = threadIdx.x; i < kTile * kDim; i += blockDim.x) {
      const int j = i / kDim;
      const int d = i % kDim;
      const int key = tile + j;
      const bool in = key < num_tokens;
      ks[j][d] = in ? k[key * kv_stride + kv_head * kDim + d] : 0.f;
      vs[j][d] = in ? v[key * kv_stride + kv_head * kDim + d] : 0.f;
    }
    __syncthreads();

    const int key = tile + lane;
    float score[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) score[i] = 0.f;
#pragma unroll 8
    for (int d = 0; d < kDim; ++d) {
      const float kd = ks[lane][d];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) score[i] = fmaf(qs[warp * kRowsPerWarp + i][d], kd, score[i]);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int t = row0 + warp * kRowsPerWarp + i;
      const bool visible = key <= t && t < num_tokens && (sliding_window == 0 || key > t - sliding_window);
      const float s = visible ? score[i] : -INFINITY;
      const float m = fmaxf(run_max[i], WarpMax(s));
      if (m == -INFINITY) continue;  // warp-uniform: no visible key yet for this row
      const float p = __expf(s - m);
      const float correction = __expf(run_max[i] - m);
      run_sum[i] = run_sum[i] * correction + WarpSum(p);
      run_max[i] = m;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) acc[i][j] *= correction;
#pragma unroll 4
      for (int jj = 0; jj < kTile; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const int d = lane + 32 * j;
          if (d < kDim) acc[i][j] = fmaf(pj, vs[jj][d], acc[i][j]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = row0 + warp * kRowsPerWarp + i;
    if (t >= num_tokens) continue;
    const float scale = OutputScale(run_sum[i]);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < kDim) out[t * out_stride + head * kDim + d] = acc[i][j] * scale;
    }
  }
}

// One thread per element of k (and of v), across as many blocks as it takes.
__global__ void StoreKvKernel(const float* __restrict__ k, const float* __restrict__ v, int64_t row_stride,
                              const int32_t* __restrict__ slots, bf16* __restrict__ k_cache,
                              bf16* __restrict__ v_cache, int64_t count, int64_t kv_size) {
  StartChained();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * kv_size) return;
  const int64_t row = i / kv_size;
  const int64_t e = i - row * kv_size;
  const float k_value = k[row * row_stride + e];
  const float v_value = v[row * row_stride + e];
  const int64_t at = static_cast<int64_t>(slots[row]) * kv_size + e;
  k_cache[at] = __float2bfloat16(k_value);
  v_cache[at] = __float2bfloat16(v_value);
}

template <int kDim>
absl::Status LaunchPrefill(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k,
                           const float* v, int64_t kv_stride, float* out, int64_t out_stride, int64_t num_tokens,
                           cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((num_tokens + kRows - 1) / kRows), static_cast<unsigned>(shape.num_q_heads));
  PrefillKernel<kDim><<<grid, kWarps * 32, 0, stream>>>(
      q, q_stride, k, v, kv_stride, out, out_stride, static_cast<int>(num_tokens),
      static_cast<int>(shape.num_q_heads / shape.num_kv_heads), static_cast<int>(shape.sliding_window),
      1.f / sqrtf(static_cast<float>(kDim)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status PrefillAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k,
                              const float* v, int64_t kv_stride, float* out, int64_t out_stride, int64_t num_tokens,
                              cudaStream_t stream) {
  if (num_tokens == 0) return absl::OkStatus();
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError("CUDA prefill attention: num_q_heads must be a multiple of num_kv_heads");
  }
  switch (shape.head_dim) {
    case 16:
      return LaunchPrefill<16>(shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
    case 32:
      return LaunchPrefill<32>(shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
    case 64:
      return LaunchPrefill<64>(shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
    case 128:
      return LaunchPrefill<128>(shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA attention: head_dim ", shape.head_dim, " (supported: 16, 32, 64, 128)"));
  }
}

absl::Status StoreKv(const float* k, const float* v, int64_t row_stride, const int32_t* slots, bf16* k_cache,
                     bf16* v_cache, int64_t count, int64_t kv_size, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const int64_t blocks = (count * kv_size + kThreads - 1) / kThreads;
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(StoreKvKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                                            stream, k, v, row_stride, slots, k_cache, v_cache, count, kv_size));
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
