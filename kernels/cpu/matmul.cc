#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/vectors.h"

namespace lamina::kernels::cpu {
namespace {

// Output columns per work item: 12 rows of w stay in L2 for K up to ~10K. A multiple of every
// tile's NR below.
constexpr int64_t kColumnBlock = 12;
// Register tiles: MR rows of x against NR rows of w, each sum a vector's lanes wide, so MR x NR
// sums, NR rows of w and a row of x in registers. AVX-512 has 32 vector registers: 4 x 6 (31)
// ran 1.2x faster than 4 x 4 on a Zen 5 core (4096 x 4096 at batch 16 and 128). AVX2 has 16:
// 4 x 3 (16) ran 1.5-1.9x faster than 4 x 4 (21, spilling). Baseline x86-64 splits each 8-float
// vector into two SSE registers and spills at any of these; 4 x 4 spilled the least.
constexpr int kMr = 4;
constexpr int kNrAvx512 = 6;
constexpr int kNrAvx2 = 3;
constexpr int kNrBaseline = 4;

// y[i][j] = x[i]·w[j] for an MR x NR tile, all of k.
template <typename Vec, int MR, int NR>
inline __attribute__((always_inline)) void Tile(const float* x, const float* w, const float* bias, float* y, int64_t k,
                                                int64_t ldy) {
  Vec acc[MR][NR] = {};
  int64_t kk = 0;
  for (; kk + kLanes<Vec> <= k; kk += kLanes<Vec>) {
    Vec wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = Load<Vec>(w + j * k + kk);
    for (int i = 0; i < MR; ++i) {
      const Vec xv = Load<Vec>(x + i * k + kk);
      for (int j = 0; j < NR; ++j) acc[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float sum = HorizontalSum(acc[i][j]);
      for (int64_t t = kk; t < k; ++t) sum += x[i * k + t] * w[j * k + t];
      y[i * ldy + j] = sum + (bias ? bias[j] : 0.0f);
    }
  }
}

template <typename Vec, int MR, int NR>
inline __attribute__((always_inline)) void RowTile(const float* x, const float* w, const float* bias, float* y,
                                                   int64_t n_count, int64_t k, int64_t ldy) {
  int64_t j = 0;
  for (; j + NR <= n_count; j += NR) Tile<Vec, MR, NR>(x, w + j * k, bias ? bias + j : nullptr, y + j, k, ldy);
  for (; j < n_count; ++j) Tile<Vec, MR, 1>(x, w + j * k, bias ? bias + j : nullptr, y + j, k, ldy);
}

// One block of output columns [n_begin, n_end) for all m rows, in kMr x NR tiles.
template <typename Vec, int NR>
inline __attribute__((always_inline)) void ColumnBlock(const float* x, const float* w, const float* bias, float* y,
                                                       int64_t m, int64_t n, int64_t k, int64_t n_begin,
                                                       int64_t n_end) {
  const float* wb = w + n_begin * k;
  const float* bb = bias ? bias + n_begin : nullptr;
  const int64_t count = n_end - n_begin;
  int64_t i = 0;
  for (; i + kMr <= m; i += kMr) RowTile<Vec, kMr, NR>(x + i * k, wb, bb, y + i * n + n_begin, count, k, n);
  for (; i < m; ++i) RowTile<Vec, 1, NR>(x + i * k, wb, bb, y + i * n + n_begin, count, k, n);
}

// ColumnBlock compiled for each instruction set (isa.h).
__attribute__((target("arch=x86-64-v4"))) void ColumnBlockAvx512(const float* x, const float* w, const float* bias,
                                                                 float* y, int64_t m, int64_t n, int64_t k,
                                                                 int64_t n_begin, int64_t n_end) {
  ColumnBlock<V16, kNrAvx512>(x, w, bias, y, m, n, k, n_begin, n_end);
}
__attribute__((target("arch=x86-64-v3"))) void ColumnBlockAvx2(const float* x, const float* w, const float* bias,
                                                               float* y, int64_t m, int64_t n, int64_t k,
                                                               int64_t n_begin, int64_t n_end) {
  ColumnBlock<V8, kNrAvx2>(x, w, bias, y, m, n, k, n_begin, n_end);
}
void ColumnBlockBaseline(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n, int64_t k,
                         int64_t n_begin, int64_t n_end) {
  ColumnBlock<V8, kNrBaseline>(x, w, bias, y, m, n, k, n_begin, n_end);
}

}  // namespace

void Matmul(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k, ThreadPool& pool) {
  if (m == 0 || n == 0) return;
  const Isa isa = ActiveIsa();
  const auto column_block = isa == Isa::kAvx512 ? ColumnBlockAvx512
                            : isa == Isa::kAvx2 ? ColumnBlockAvx2
                                                : ColumnBlockBaseline;
  const int64_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
  pool.ParallelFor(blocks, [&](int64_t b) {
    int64_t begin = b * kColumnBlock;
    column_block(x, w, bias, y, m, n, k, begin, std::min(n, begin + kColumnBlock));
  });
}

}  // namespace lamina::kernels::cpu
