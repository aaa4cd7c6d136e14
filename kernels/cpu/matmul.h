// Dense projection on the CPU: y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]).
// Weights are row-major as in Hugging Face checkpoints ([out_features, in_features]).
// Multithreaded over blocks of output columns; each thread streams its block of w once for all m
// rows (decode is bound by reading w). Vectorised for AVX-512 and AVX2+FMA, chosen at run time (isa.h).
// Thread-safe; x, w, bias and y must not overlap.
#ifndef LAMINA_KERNELS_CPU_MATMUL_H_
#define LAMINA_KERNELS_CPU_MATMUL_H_

#include <cstdint>

#include "common/threading/thread_pool.h"

namespace lamina::kernels::cpu {

void Matmul(const float* x,     // [m, k]
            const float* w,     // [n, k]
            const float* bias,  // [n] or nullptr
            float* y,           // [m, n]
            int64_t m, int64_t n, int64_t k, ThreadPool& pool = ThreadPool::Default());

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_MATMUL_H_
