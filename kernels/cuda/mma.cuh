// Warp-level building blocks in inline PTX (sm_80 and later): asynchronous copies from global to
// shared memory (cp.async), matrix loads from shared memory (ldmatrix) and bf16 tensor-core
// products (mma.sync m16n8k16, float32 accumulators).
//
// Fragment layouts, from the PTX ISA, for lane l of a warp, with g = l / 4 and c = l % 4:
//  - A (16 x 16, row-major), four registers of two bf16: a[0] = A[g][2c..2c+1],
//    a[1] = A[g + 8][2c..2c+1], a[2] = A[g][2c + 8..2c + 9], a[3] = A[g + 8][2c + 8..2c + 9];
//  - B (16 x 8, k by n), two registers: b[0] = B[2c..2c+1][g], b[1] = B[2c + 8..2c + 9][g];
//  - C and D (16 x 8), four floats: d[0..1] = D[g][2c..2c+1], d[2..3] = D[g + 8][2c..2c+1].
// LoadMatrices gives lane l, from 8 x 8 matrix i (rows addressed by lanes 8i..8i+7), row g,
// elements 2c..2c+1; LoadMatricesTransposed gives rows 2c..2c+1 of column g instead.
#ifndef LAMINA_KERNELS_CUDA_MMA_CUH_
#define LAMINA_KERNELS_CUDA_MMA_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace lamina::kernels::cuda {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes from global `src` to shared address `dst` (16-byte aligned, both), without
// passing through registers or L1, and has L2 fetch the 256 bytes around them (a KV row of head_dim
// 128 in one DRAM access: decode attention reads a few percent faster so). When !valid, writes 16
// zero bytes instead and reads nothing.
__device__ __forceinline__ void CopyAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// The same for 8 bytes (8-byte aligned), through L1 (the cache-global form takes 16 bytes only).
__device__ __forceinline__ void CopyAsync8(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0) : "memory");
}

// The same for 4 bytes (4-byte aligned), through L1.
__device__ __forceinline__ void CopyAsync4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// Closes the group of the thread's copies issued since the last commit.
__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `kPending` of the thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8 x 8 matrices of 16-bit values; lane l addresses row l % 8 of matrix l / 8 (16 bytes).
__device__ __forceinline__ void LoadMatrices(uint32_t row_address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_address)
               : "memory");
}

__device__ __forceinline__ void LoadMatricesTransposed(uint32_t row_address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_address)
               : "memory");
}

// d += A·B on the tensor cores.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same for an A whose rows 8..15 are zero: only a[0] and a[2] are given.
__device__ __forceinline__ void MmaUpperRows(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, 0u, a2, 0u};
  Mma(d, a, b0, b1);
}

// x0 and x1 as two bf16 pairs whose sum gives them to about 2^-17 relative: `high` rounds them,
// `low` rounds what is left. Products of both with bf16 values, summed in float32, come within
// float32's reach of the exact ones, where one bf16 pair would lose a part in 2^9.
__device__ __forceinline__ void SplitBf16(float x0, float x1, uint32_t& high, uint32_t& low) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 back = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - back.x, x1 - back.y);
  high = *reinterpret_cast<const uint32_t*>(&h);
  low = *reinterpret_cast<const uint32_t*>(&l);
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_MMA_CUH_
