// Row-wise and element-wise CPU ops of the LLaMA slice: embedding lookup, RMSNorm, SwiGLU.
// Thread-safe; inputs and outputs may alias only where noted.
#ifndef LAMINA_KERNELS_CPU_ELEMENTWISE_H_
#define LAMINA_KERNELS_CPU_ELEMENTWISE_H_

#include <cstdint>

namespace lamina::kernels::cpu {

// out[i] = table[ids[i]]. Ids must be in range (callers validate requests).
void Embedding(const float* table,  // [vocab, dim]
               const int32_t* ids,  // [count]
               float* out,          // [count, dim]
               int64_t count, int64_t dim);

// out[r] = x[r] / sqrt(mean(x[r]²) + eps) * weight. out may alias x.
void RmsNorm(const float* x,       // [rows, dim]
             const float* weight,  // [dim]
             float* out,           // [rows, dim]
             int64_t rows, int64_t dim, double eps);

// out[r][i] = silu(gate_up[r][i]) * gate_up[r][inter + i]: the gate and up projections side by side.
void SwiGlu(const float* gate_up,  // [rows, 2 * inter]
            float* out,            // [rows, inter]
            int64_t rows, int64_t inter);

// y[i] += x[i].
void AddInPlace(float* y, const float* x, int64_t count);

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_ELEMENTWISE_H_
