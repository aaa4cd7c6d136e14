#include "kernels/cuda/elementwise.h"

#include <cmath>

#include "common/cuda/cuda_check.h"
#include "kernels/cuda/random.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count, int per_block = kThreads) {
  return static_cast<int>((count + per_block - 1) / per_block);
}

__global__ void EmbeddingKernel(const bf16* table, const int32_t* tokens, float* out, int64_t hidden) {
  const int64_t row = blockIdx.x;
  const bf16* src = table + static_cast<int64_t>(tokens[row]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[row * hidden + i] = __bfloat162float(src[i]);
}

__global__ void RmsNormKernel(float* x, const float* delta, const bf16* weight, bf16* out, int64_t hidden,
                              float eps) {
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

__global__ void SwiGluKernel(const float* gate_up, bf16* out, int64_t count, int64_t intermediate) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * intermediate) return;
  const int64_t row = i / intermediate;
  const int64_t col = i - row * intermediate;
  const float g = gate_up[row * 2 * intermediate + col];
  const float u = gate_up[row * 2 * intermediate + intermediate + col];
  out[i] = __float2bfloat16(g / (1.f + __expf(-g)) * u);
}

__global__ void RopeKernel(float* x, const int32_t* positions, const float* cos_sin, int64_t num_heads,
                           int64_t head_dim, int64_t row_stride) {
  const int64_t row = blockIdx.x;
  const int64_t half = head_dim / 2;
  const float* table = cos_sin + static_cast<int64_t>(positions[row]) * head_dim;
  for (int64_t i = threadIdx.x; i < num_heads * half; i += blockDim.x) {
    const int64_t head = i / half;
    const int64_t j = i - head * half;
    float* h = x + row * row_stride + head * head_dim;
    const float c = table[j];
    const float s = table[half + j];
    const float a = h[j];
    const float b = h[j + half];
    h[j] = a * c - b * s;
    h[j + half] = b * c + a * s;
  }
}

__global__ void ToBf16Kernel(const float* in, bf16* out, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2bfloat16(in[i]);
}

__global__ void GatherRowsKernel(const float* in, const int32_t* rows, float* out, int64_t cols) {
  const int64_t r = blockIdx.x;
  const float* src = in + static_cast<int64_t>(rows[r]) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[r * cols + i] = src[i];
}

__global__ void FillUniformKernel(bf16* out, int64_t count, float scale, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(SplitMix64(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 40) * 0x1p-24f;
    out[i] = __float2bfloat16((2.f * u - 1.f) * scale);
  }
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
  EmbeddingKernel<<<count, kThreads, 0, stream>>>(table, tokens, out, hidden);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status RmsNorm(float* x, const float* delta, const bf16* weight, bf16* out, int64_t count, int64_t hidden,
                     float eps, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  RmsNormKernel<<<count, 512, 0, stream>>>(x, delta, weight, out, hidden, eps);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status SwiGlu(const float* gate_up, bf16* out, int64_t count, int64_t intermediate, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  SwiGluKernel<<<Blocks(count * intermediate), kThreads, 0, stream>>>(gate_up, out, count, intermediate);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status Rope(float* x, const int32_t* positions, const float* cos_sin, int64_t count, int64_t num_heads,
                  int64_t head_dim, int64_t row_stride, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  RopeKernel<<<count, kThreads, 0, stream>>>(x, positions, cos_sin, num_heads, head_dim, row_stride);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status ToBf16(const float* in, bf16* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  ToBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(in, out, count);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status GatherRows(const float* in, const int32_t* rows, float* out, int64_t count, int64_t cols,
                        cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  GatherRowsKernel<<<count, kThreads, 0, stream>>>(in, rows, out, cols);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status FillUniform(bf16* out, int64_t count, float scale, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  FillUniformKernel<<<1024, kThreads, 0, stream>>>(out, count, scale, seed);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
