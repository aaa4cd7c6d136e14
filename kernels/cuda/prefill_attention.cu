// Causal prefill attention, FlashAttention-2 style, in two forms:
//  - on the tensor cores (PrefillAttention): a block of 4 warps owns 64 query rows of one head, 16
//    a warp, their q rounded to bf16 and held in registers as mma A fragments; it walks the keys in
//    tiles of 64, staging k and v as bf16 in shared memory (rows padded by 16 bytes, so that the
//    8 rows an ldmatrix reads fall in distinct banks). S = q·kᵀ and O += P·v are mma.sync m16n8k16
//    products with float32 accumulators; the online softmax (exp2 of pre-scaled scores) runs on the
//    accumulators, whose fragments become P's A fragments with no trip through shared memory;
//  - on the CUDA cores in float32 (PrefillAttentionOnCudaCores), the kernel before: a block of 16
//    rows of one head walks keys in tiles of 32; kept as the float32 reference the benchmark
//    compares with.
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/mma.cuh"
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

// The tensor-core kernel's shape: 4 warps of 16 query rows; key tiles of 64; shared rows padded.
constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;
constexpr int kTcKeys = 64;
template <int kDim>
constexpr int TcRowStride() { return kDim + 8; }  // bf16 elements

// Rows [row0, row0 + rows) of `src` (float32, `stride` apart, `kDim` from `offset`) into shared
// `dst` [rows][TcRowStride] as bf16; rows past `limit` are zeros.
template <int kDim>
__device__ __forceinline__ void StageRows(const float* __restrict__ src, int64_t stride, int64_t offset, int row0,
                                          int rows, int limit, bf16* dst) {
  constexpr int kQuads = kDim / 4;
  for (int i = threadIdx.x; i < rows * kQuads; i += blockDim.x) {
    const int r = i / kQuads;
    const int d = (i % kQuads) * 4;
    const int t = row0 + r;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < limit) x = *reinterpret_cast<const float4*>(src + t * stride + offset + d);
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(dst + r * TcRowStride<kDim>() + d);
    out[0] = __floats2bfloat162_rn(x.x, x.y);
    out[1] = __floats2bfloat162_rn(x.z, x.w);
  }
}

__device__ __forceinline__ uint32_t PackBf16(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <int kDim>
__global__ void __launch_bounds__(kTcWarps * 32) PrefillTensorCoreKernel(
    const float* __restrict__ q, int64_t q_stride, const float* __restrict__ k, const float* __restrict__ v,
    int64_t kv_stride, float* __restrict__ out, int64_t out_stride, int num_tokens, int group, int sliding_window,
    float scale_log2) {
  constexpr int kStride = TcRowStride<kDim>();
  constexpr int kSteps = kDim / 16;   // k-steps of q·kᵀ
  constexpr int kDimBlocks = kDim / 8;  // n-blocks of the output
  constexpr int kKeyBlocks = kTcKeys / 8;
  __shared__ __align__(16) bf16 ks[kTcKeys * kStride];
  __shared__ __align__(16) bf16 vs[kTcKeys * kStride];
  const int head = blockIdx.y;
  const int kv_head = head / group;
  const int row0 = blockIdx.x * kTcRows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  // The warp's q rows as A fragments, staged through the k tile's memory.
  StageRows<kDim>(q, q_stride, static_cast<int64_t>(head) * kDim, row0, kTcRows, num_tokens, ks);
  __syncthreads();
  uint32_t qa[kSteps][4];
  {
    const int r = warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      LoadMatrices(SharedAddress(ks + r * kStride + s * 16 + 8 * (lane / 16)), qa[s]);
    }
  }

  float o[kDimBlocks][4];
#pragma unroll
  for (int j = 0; j < kDimBlocks; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float run_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8 of the warp
  float run_sum[2] = {0.f, 0.f};
  const int my_row[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};

  const int last_row = min(num_tokens, row0 + kTcRows) - 1;
  int first_key = 0;
  if (sliding_window > 0) first_key = max(0, row0 - sliding_window + 1);
  const int64_t kv_offset = static_cast<int64_t>(kv_head) * kDim;
  for (int tile = first_key / kTcKeys * kTcKeys; tile <= last_row; tile += kTcKeys) {
    __syncthreads();  // the last tile's (or q's) reads are done
    StageRows<kDim>(k, kv_stride, kv_offset, tile, kTcKeys, num_tokens, ks);
    StageRows<kDim>(v, kv_stride, kv_offset, tile, kTcKeys, num_tokens, vs);
    __syncthreads();
    // The warp's rows see no key of this tile: nothing to add.
    if (tile > row0 + warp * 16 + 15) continue;

    float s[kKeyBlocks][4];
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int j = 0; j < kKeyBlocks; j += 2) {
      const int key = j * 8 + (lane % 8) + 8 * (lane / 16);
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        uint32_t b[4];
        LoadMatrices(SharedAddress(ks + key * kStride + st * 16 + 8 * ((lane / 8) % 2)), b);
        Mma(s[j], qa[st], b[0], b[1]);
        Mma(s[j + 1], qa[st], b[2], b[3]);
      }
    }
    // Scale, mask, and the rows' running maxima.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = tile + j * 8 + 2 * c + (e % 2);
        const int t = my_row[e / 2];
        const bool visible = key <= t && (sliding_window == 0 || key > t - sliding_window);
        s[j][e] = visible ? s[j][e] * scale_log2 : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
      }
    }
    float correction[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float m = fmaxf(run_max[h], tile_max[h]);
      correction[h] = m == -INFINITY ? 1.f : exp2f(run_max[h] - m);
      run_max[h] = m;
    }
    float tile_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float m = run_max[e / 2];
        s[j][e] = m == -INFINITY ? 0.f : exp2f(s[j][e] - m);
        tile_sum[e / 2] += s[j][e];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) run_sum[h] = run_sum[h] * correction[h] + tile_sum[h];
#pragma unroll
    for (int j = 0; j < kDimBlocks; ++j) {
      o[j][0] *= correction[0];
      o[j][1] *= correction[0];
      o[j][2] *= correction[1];
      o[j][3] *= correction[1];
    }
    // O += P·v: P's A fragments are the score accumulators, two key blocks a k-step.
#pragma unroll
    for (int kk = 0; kk < kTcKeys / 16; ++kk) {
      const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]), PackBf16(s[2 * kk][2], s[2 * kk][3]),
                              PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int key = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
#pragma unroll
      for (int jd = 0; jd < kDimBlocks; jd += 2) {
        uint32_t b[4];
        LoadMatricesTransposed(SharedAddress(vs + key * kStride + (jd + lane / 16) * 8), b);
        Mma(o[jd], pa, b[0], b[1]);
        Mma(o[jd + 1], pa, b[2], b[3]);
      }
    }
  }

  // Each row's sum is spread over the four lanes that share it.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = my_row[h];
    if (t >= num_tokens) continue;
    const float scale = OutputScale(run_sum[h]);
    float* row = out + t * out_stride + static_cast<int64_t>(head) * kDim;
#pragma unroll
    for (int j = 0; j < kDimBlocks; ++j) {
      *reinterpret_cast<float2*>(row + j * 8 + 2 * c) = make_float2(o[j][2 * h] * scale, o[j][2 * h + 1] * scale);
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
absl::Status LaunchPrefill(bool tensor_cores, const AttentionShape& shape, const float* q, int64_t q_stride,
                           const float* k, const float* v, int64_t kv_stride, float* out, int64_t out_stride,
                           int64_t num_tokens, cudaStream_t stream) {
  const int group = static_cast<int>(shape.num_q_heads / shape.num_kv_heads);
  const int window = static_cast<int>(shape.sliding_window);
  const float scale = 1.f / sqrtf(static_cast<float>(kDim));
  if (tensor_cores) {
    const dim3 grid(static_cast<unsigned>((num_tokens + kTcRows - 1) / kTcRows),
                    static_cast<unsigned>(shape.num_q_heads));
    PrefillTensorCoreKernel<kDim><<<grid, kTcWarps * 32, 0, stream>>>(
        q, q_stride, k, v, kv_stride, out, out_stride, static_cast<int>(num_tokens), group, window,
        scale * 1.4426950408889634f);
  } else {
    const dim3 grid(static_cast<unsigned>((num_tokens + kRows - 1) / kRows), static_cast<unsigned>(shape.num_q_heads));
    PrefillKernel<kDim><<<grid, kWarps * 32, 0, stream>>>(q, q_stride, k, v, kv_stride, out, out_stride,
                                                          static_cast<int>(num_tokens), group, window, scale);
  }
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status Prefill(bool tensor_cores, const AttentionShape& shape, const float* q, int64_t q_stride, const float* k,
                     const float* v, int64_t kv_stride, float* out, int64_t out_stride, int64_t num_tokens,
                     cudaStream_t stream) {
  if (num_tokens == 0) return absl::OkStatus();
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError("CUDA prefill attention: num_q_heads must be a multiple of num_kv_heads");
  }
  // The tensor-core kernel reads q, k and v four floats at a time.
  if (tensor_cores && (q_stride % 4 != 0 || kv_stride % 4 != 0 || reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
                       reinterpret_cast<uintptr_t>(k) % 16 != 0 || reinterpret_cast<uintptr_t>(v) % 16 != 0 ||
                       out_stride % 2 != 0 || reinterpret_cast<uintptr_t>(out) % 8 != 0)) {
    return absl::InvalidArgumentError("CUDA prefill attention: q, k and v must be 16-byte aligned rows, out 8-byte");
  }
  switch (shape.head_dim) {
    case 16:
      return LaunchPrefill<16>(tensor_cores, shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
    case 32:
      return LaunchPrefill<32>(tensor_cores, shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
    case 64:
      return LaunchPrefill<64>(tensor_cores, shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
    case 128:
      return LaunchPrefill<128>(tensor_cores, shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens,
                                stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA attention: head_dim ", shape.head_dim, " (supported: 16, 32, 64, 128)"));
  }
}

}  // namespace

absl::Status PrefillAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k,
                              const float* v, int64_t kv_stride, float* out, int64_t out_stride, int64_t num_tokens,
                              cudaStream_t stream) {
  return Prefill(true, shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
}

absl::Status PrefillAttentionOnCudaCores(const AttentionShape& shape, const float* q, int64_t q_stride,
                                         const float* k, const float* v, int64_t kv_stride, float* out,
                                         int64_t out_stride, int64_t num_tokens, cudaStream_t stream) {
  return Prefill(false, shape, q, q_stride, k, v, kv_stride, out, out_stride, num_tokens, stream);
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
