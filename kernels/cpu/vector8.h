// Eight floats as one GCC vector: one AVX register in the x86-64-v3/v4 clones (target_clones) of
// the CPU kernels, a pair of SSE registers in their default clone. Loads and stores take any
// float-aligned address. Include only from the CPU kernels' .cc files.
#ifndef LAMINA_KERNELS_CPU_VECTOR8_H_
#define LAMINA_KERNELS_CPU_VECTOR8_H_

namespace lamina::kernels::cpu {

typedef float V8 __attribute__((vector_size(32)));
typedef float V8Unaligned __attribute__((vector_size(32), aligned(4)));

inline __attribute__((always_inline)) V8 Load8(const float* p) { return *reinterpret_cast<const V8Unaligned*>(p); }
inline __attribute__((always_inline)) void Store8(float* p, V8 v) { *reinterpret_cast<V8Unaligned*>(p) = v; }

// The sum of the eight, pairwise.
inline __attribute__((always_inline)) float HorizontalSum(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_VECTOR8_H_
