#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <cstring>

namespace lamina::kernels::cpu {

void Embedding(const float* table, const int32_t* ids, float* out, int64_t count, int64_t dim) {
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(out + i * dim, table + static_cast<int64_t>(ids[i]) * dim, dim * sizeof(float));
  }
}

void RmsNorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double sum_sq = 0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
    float* yr = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void SwiGlu(const float* gate_up, float* out, int64_t rows, int64_t inter) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * inter;
    const float* up = gate + inter;
    float* y = out + r * inter;
    for (int64_t i = 0; i < inter; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

void AddInPlace(float* y, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

}  // namespace lamina::kernels::cpu
