// CUDA elementwise kernels of the compute slices, the siblings of kernels/cpu/elementwise.h and
// kernels/cpu/rope.h. Activations that feed a GEMM are bf16; the residual stream, q/k/v and logits
// stay float32. Every launcher takes raw device pointers, sizes and a stream, queues the work and
// returns the launch status (it never synchronizes). The kernels are chained (chaining.h): each may
// start while the kernel before it in the stream ends. Thread-safe.
#ifndef LAMINA_KERNELS_CUDA_ELEMENTWISE_H_
#define LAMINA_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace lamina::kernels::cuda {

using bf16 = __nv_bfloat16;

// out[i] = table[tokens[i]] as float32.
absl::Status Embedding(const bf16* table,     // [vocab, hidden]
                       const int32_t* tokens,  // [count]
                       float* out,             // [count, hidden]
                       int64_t count, int64_t hidden, cudaStream_t stream);

// With `delta`: x += delta first (the residual add fused in). Then
// out = x / rms(x) * weight, rounded to bf16 for the next GEMM.
absl::Status RmsNorm(float* x,             // [count, hidden], the residual stream
                     const float* delta,   // [count, hidden] or nullptr
                     const bf16* weight,   // [hidden]
                     bf16* out,            // [count, hidden]
                     int64_t count, int64_t hidden, float eps, cudaStream_t stream);

// out = silu(gate) * up, with gate and up the two halves of each row of `gate_up`.
absl::Status SwiGlu(const float* gate_up,  // [count, 2 * intermediate]
                    bf16* out,             // [count, intermediate]
                    int64_t count, int64_t intermediate, cudaStream_t stream);

// Rotates `num_heads` heads at the start of each row in place ("rotate half" layout) by angles
// position * inv_freq, with cos/sin from a table computed on the host in float64.
absl::Status Rope(float* x,                  // [count, row_stride]
                  const int32_t* positions,  // [count]
                  const float* cos_sin,      // [max_position, head_dim]: cos then sin halves
                  int64_t count, int64_t num_heads, int64_t head_dim, int64_t row_stride,
                  cudaStream_t stream);

// The table Rope() reads: for each position p and i < head_dim / 2, cos(p · inv_freq[i]) at
// [p][i] and sin at [p][head_dim / 2 + i], computed in float64 (as the CPU Rope does).
std::vector<float> RopeCosSin(const std::vector<double>& inv_freq, int64_t max_position);

// out = round_to_bf16(in).
absl::Status ToBf16(const float* in, bf16* out, int64_t count, cudaStream_t stream);

// Gathers rows: out[i] = in[rows[i]].
absl::Status GatherRows(const float* in,       // [*, cols]
                        const int32_t* rows,   // [count]
                        float* out,            // [count, cols]
                        int64_t count, int64_t cols, cudaStream_t stream);

// Fills with uniform values in [-scale, scale) from a counter-based hash of (seed, index), for
// benchmarks with random weights or activations (all-zero rows would not do: a division of zero
// takes the slow path of CUDA's IEEE division, a cost real rows never pay).
absl::Status FillUniform(bf16* out, int64_t count, float scale, uint64_t seed, cudaStream_t stream);
absl::Status FillUniform(float* out, int64_t count, float scale, uint64_t seed, cudaStream_t stream);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_ELEMENTWISE_H_
