// Float vectors for the CPU kernels, as GCC vectors: V8 (eight floats) and V16 (sixteen). Each
// kernel body is a template over the vector type, compiled once for each instruction set
// (kernels/cpu/isa.h): V16 is one register with AVX-512; V8 one register with AVX2 and a pair
// with the baseline's SSE. Loads and stores take any float-aligned address. Include only from the
// CPU kernels' .cc files, and call these only from functions compiled for an instruction set
// (they are always inlined into them). Loads also widen bfloat16 values (their bits, as uint16_t).
#ifndef LAMINA_KERNELS_CPU_VECTORS_H_
#define LAMINA_KERNELS_CPU_VECTORS_H_

#include <cstdint>

namespace lamina::kernels::cpu {

typedef float V8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));

// Floats in a vector of type Vec.
template <typename Vec>
constexpr int kLanes = sizeof(Vec) / sizeof(float);

template <typename Vec>
inline __attribute__((always_inline)) Vec Load(const float* p) {
  Vec v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// Widens the bfloat16s at p exactly: a bfloat16 is the top half of the float it stands for.
// Halves: them as a vector of uint16_t, Words: as uint32_t, each as many lanes as Vec.
template <typename Vec, typename Halves, typename Words>
inline __attribute__((always_inline)) Vec Widen(const uint16_t* p) {
  Halves h;
  __builtin_memcpy(&h, p, sizeof(h));
  return __builtin_bit_cast(Vec, __builtin_convertvector(h, Words) << 16);
}

typedef uint16_t U16x8 __attribute__((vector_size(16)));
typedef uint32_t U32x8 __attribute__((vector_size(32)));
typedef uint16_t U16x16 __attribute__((vector_size(32)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));

// Loads kLanes<Vec> bfloat16 values (their bits) widened to floats.
template <typename Vec>
Vec Load(const uint16_t* p);
template <>
inline __attribute__((always_inline)) V8 Load<V8>(const uint16_t* p) {
  return Widen<V8, U16x8, U32x8>(p);
}
template <>
inline __attribute__((always_inline)) V16 Load<V16>(const uint16_t* p) {
  return Widen<V16, U16x16, U32x16>(p);
}

// One element as a float: itself, or a bfloat16's bits widened.
inline __attribute__((always_inline)) float ToFloat(float x) { return x; }
inline __attribute__((always_inline)) float ToFloat(uint16_t bits) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16);
}

template <typename Vec>
inline __attribute__((always_inline)) void Store(float* p, Vec v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// The eight lanes of a V8, or the sums of a V16's two halves.
inline __attribute__((always_inline)) V8 Fold(V8 v) { return v; }
inline __attribute__((always_inline)) V8 Fold(V16 v) {
  return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
}

// The sum of the lanes, pairwise.
inline __attribute__((always_inline)) float HorizontalSum(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
inline __attribute__((always_inline)) float HorizontalSum(V16 v) { return HorizontalSum(Fold(v)); }

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_VECTORS_H_
