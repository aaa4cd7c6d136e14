#include "kernels/cuda/elementwise.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/cuda/cuda_check.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/random.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int64_t Blocks(int64_t count, int per_block = kThreads) { return (count + per_block - 1) / per_block; }

dim3 Grid(int64_t blocks) { return dim3(static_cast<unsigned>(blocks)); }

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// One thread per value, across as many blocks as it takes.
__global__ void EmbeddingKernel(const bf16* table, const int32_t* tokens, float* out, int64_t count, int64_t hidden) {
  StartChained();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * hidden) return;
  const int64_t row = i / hidden;
  out[i] = __bfloat162float(table[static_cast<int64_t>(tokens[row]) * hidden + i - row * hidden]);
}

__global__ void RmsNormKernel(float* x, const float* delta, const bf16* weight, bf16* out, int64_t hidden,
                              float eps) {
  StartChained();
  const int64_t row = blockIdx.x;
  float* xr = x + row * hidden;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = xr[i];
    if (delta != nullptr) {
      v += delta[row * hidden + i];
      xr[i] = v;
    }
    sum += v * v;
  }
  sum = BlockSum(sum);
  const float scale = rsqrtf(sum / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[row * hidden + i] = __float2bfloat16(xr[i] * scale * __bfloat162float(weight[i]));
  }
}

// RmsNormKernel for rows of whole float4s, at most kNormQuads of them per thread: a thread loads its
// whole share at once and keeps it for the output, so the block waits on memory once rather than
// once per loop turn (at batch 1 a row is one block and its latency is the kernel's time). The
// weights, constant, are loaded before the wait for the kernel before.
constexpr int kNormQuads = 4;
__global__ void RmsNormQuadsKernel(float* x, const float* delta, const bf16* weight, bf16* out, int64_t hidden,
                                   float eps) {
  LetNextKernelStart();
  const int64_t quads = hidden / 4;
  uint2 w[kNormQuads];  // 4 bf16 each
#pragma unroll
  for (int i = 0; i < kNormQuads; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (q < quads) w[i] = reinterpret_cast<const uint2*>(weight)[q];
  }
  WaitForPreviousKernel();
  const int64_t row = blockIdx.x;
  float4* xr = reinterpret_cast<float4*>(x + row * hidden);
  const float4* dr = delta != nullptr ? reinterpret_cast<const float4*>(delta + row * hidden) : nullptr;
  float4 v[kNormQuads];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kNormQuads; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (q >= quads) continue;
    v[i] = xr[q];
    if (dr != nullptr) {
      const float4 d = dr[q];
      v[i] = make_float4(v[i].x + d.x, v[i].y + d.y, v[i].z + d.z, v[i].w + d.w);
      xr[q] = v[i];
    }
    sum += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  sum = BlockSum(sum);
  const float scale = rsqrtf(sum / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int i = 0; i < kNormQuads; ++i) {
    const int64_t q = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (q >= quads) continue;
    const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w[i]);
    const float2 wa = __bfloat1622float2(w2[0]), wb = __bfloat1622float2(w2[1]);
    uint2 packed;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&packed);
    o2[0] = __floats2bfloat162_rn(v[i].x * scale * wa.x, v[i].y * scale * wa.y);
    o2[1] = __floats2bfloat162_rn(v[i].z * scale * wb.x, v[i].w * scale * wb.y);
    reinterpret_cast<uint2*>(out + row * hidden)[q] = packed;
  }
}

__global__ void SwiGluKernel(const float* gate_up, bf16* out, int64_t count, int64_t intermediate) {
  StartChained();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * intermediate) return;
  const int64_t row = i / intermediate;
  const int64_t col = i - row * intermediate;
  const float g = gate_up[row * 2 * intermediate + col];
  const float u = gate_up[row * 2 * intermediate + intermediate + col];
  out[i] = __float2bfloat16(g / (1.f + __expf(-g)) * u);
}

// One thread per rotated pair, across as many blocks as it takes: each thread's loads go out at once.
__global__ void RopeKernel(float* x, const int32_t* positions, const float* cos_sin, int64_t count, int64_t num_heads,
                           int64_t head_dim, int64_t row_stride) {
  StartChained();
  const int64_t half = head_dim / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * num_heads * half) return;
  const int64_t row = i / (num_heads * half);
  const int64_t head = i / half - row * num_heads;
  const int64_t j = i % half;
  float* h = x + row * row_stride + head * head_dim;
  const float a = h[j];
  const float b = h[j + half];
  const float* table = cos_sin + static_cast<int64_t>(positions[row]) * head_dim;
  const float c = table[j];
  const float s = table[half + j];
  h[j] = a * c - b * s;
  h[j + half] = b * c + a * s;
}

__global__ void ToBf16Kernel(const float* in, bf16* out, int64_t count) {
  StartChained();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2bfloat16(in[i]);
}

__global__ void GatherRowsKernel(const float* in, const int32_t* rows, float* out, int64_t cols) {
  StartChained();
  const int64_t r = blockIdx.x;
  const float* src = in + static_cast<int64_t>(rows[r]) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[r * cols + i] = src[i];
}

template <typename T>
__global__ void FillUniformKernel(T* out, int64_t count, float scale, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(SplitMix64(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 40) * 0x1p-24f;
    if constexpr (std::is_same_v<T, bf16>) {
      out[i] = __float2bfloat16((2.f * u - 1.f) * scale);
    } else {
      out[i] = (2.f * u - 1.f) * scale;
    }
  }
}

template <typename T>
absl::Status LaunchFillUniform(T* out, int64_t count, float scale, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  FillUniformKernel<<<1024, kThreads, 0, stream>>>(out, count, scale, seed);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

std::vector<float> RopeCosSin(const std::vector<double>& inv_freq, int64_t max_position) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  std::vector<float> table(max_position * 2 * half);
  for (int64_t p = 0; p < max_position; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      table[p * 2 * half + i] = static_cast<float>(std::cos(angle));
      table[p * 2 * half + half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

absl::Status Embedding(const bf16* table, const int32_t* tokens, float* out, int64_t count, int64_t hidden,
                       cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(EmbeddingKernel, Grid(Blocks(count * hidden)), kThreads, 0, stream, table,
                                            tokens, out, count, hidden));
  return absl::OkStatus();
}

absl::Status RmsNorm(float* x, const float* delta, const bf16* weight, bf16* out, int64_t count, int64_t hidden,
                     float eps, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  // Threads for kNormQuads float4s each, in whole warps.
  const int64_t quad_threads = (hidden / 4 + kNormQuads - 1) / kNormQuads;
  const int64_t threads = std::max<int64_t>(32, (quad_threads + 31) / 32 * 32);
  const bool quads = hidden % 4 == 0 && threads <= 1024 && Aligned(x, 16) && Aligned(delta, 16) && Aligned(weight, 8) &&
                     Aligned(out, 8);
  if (quads) {
    LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(RmsNormQuadsKernel, Grid(count), dim3(static_cast<unsigned>(threads)), 0,
                                              stream, x, delta, weight, out, hidden, eps));
  } else {
    LAMINA_CUDA_RETURN_IF_ERROR(
        LaunchChained(RmsNormKernel, Grid(count), 512, 0, stream, x, delta, weight, out, hidden, eps));
  }
  return absl::OkStatus();
}

absl::Status SwiGlu(const float* gate_up, bf16* out, int64_t count, int64_t intermediate, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(SwiGluKernel, Grid(Blocks(count * intermediate)), kThreads, 0, stream,
                                            gate_up, out, count, intermediate));
  return absl::OkStatus();
}

absl::Status Rope(float* x, const int32_t* positions, const float* cos_sin, int64_t count, int64_t num_heads,
                  int64_t head_dim, int64_t row_stride, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(RopeKernel, Grid(Blocks(count * num_heads * (head_dim / 2))), kThreads,
                                            0, stream, x, positions, cos_sin, count, num_heads, head_dim, row_stride));
  return absl::OkStatus();
}

absl::Status ToBf16(const float* in, bf16* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(ToBf16Kernel, Grid(Blocks(count)), kThreads, 0, stream, in, out, count));
  return absl::OkStatus();
}

absl::Status GatherRows(const float* in, const int32_t* rows, float* out, int64_t count, int64_t cols,
                        cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(GatherRowsKernel, Grid(count), kThreads, 0, stream, in, rows, out, cols));
  return absl::OkStatus();
}

absl::Status FillUniform(bf16* out, int64_t count, float scale, uint64_t seed, cudaStream_t stream) {
  return LaunchFillUniform(out, count, scale, seed, stream);
}

absl::Status FillUniform(float* out, int64_t count, float scale, uint64_t seed, cudaStream_t stream) {
  return LaunchFillUniform(out, count, scale, seed, stream);
}

}  // namespace lamina::kernels::cuda
