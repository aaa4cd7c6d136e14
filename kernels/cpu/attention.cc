#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/float8_rows.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vectors.h"

namespace lamina::kernels::cpu {
namespace {

// Keys are scored in blocks; each block updates the running max, the sum and the output.
constexpr int64_t kKeyBlock = 16;

// The sums of four vectors' lanes, in one vector's first four lanes: pairs of vectors folded
// into each other by shuffles, so that four sums cost three shuffle pairs, not four reductions.
inline __attribute__((always_inline)) void Sum4(V8 a, V8 b, V8 c, V8 d, float* out) {
  // __builtin_shufflevector, which GCC and clang both take (GCC's __builtin_shuffle clang does not).
  const V8 ab = __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11) +
                __builtin_shufflevector(a, b, 4, 12, 5, 13, 6, 14, 7, 15);
  const V8 cd = __builtin_shufflevector(c, d, 0, 8, 1, 9, 2, 10, 3, 11) +
                __builtin_shufflevector(c, d, 4, 12, 5, 13, 6, 14, 7, 15);
  // Lanes of ab: a, b, a, b, ...; of cd: c, d, c, d, ... (each the sum of two of the input's lanes).
  const V8 abcd = __builtin_shufflevector(ab, cd, 0, 1, 8, 9, 4, 5, 12, 13) +
                  __builtin_shufflevector(ab, cd, 2, 3, 10, 11, 6, 7, 14, 15);
  for (int i = 0; i < 4; ++i) out[i] = abcd[i] + abcd[i + 4];
}

// 2^x on eight lanes, for x <= 0: exact at integers (2^0 = 1, so a single key's weight is exactly
// 1); 0 at or below -126 (-inf and NaN included). 2^x = 2^n · e^((x - n) ln 2) with n the nearest
// integer (rounded by adding and taking away 1.5 · 2^23; |x| stays far below 2^22), the second
// factor by its Taylor series to degree 7 (|x - n| <= 1/2: the series' relative error is below
// 6e-9, float rounding aside).
inline __attribute__((always_inline)) V8 Exp2(V8 x) {
  typedef int32_t I8 __attribute__((vector_size(32)));
  const I8 in_range = x > -126.0f;  // false for -inf and NaN too
  x = in_range ? x : V8{} - 126.0f;
  const V8 whole = (x + 12582912.0f) - 12582912.0f;
  const V8 y = (x - whole) * 0.69314718056f;
  V8 p = V8{} + 1.0f / 5040;
  p = p * y + 1.0f / 720;
  p = p * y + 1.0f / 120;
  p = p * y + 1.0f / 24;
  p = p * y + 1.0f / 6;
  p = p * y + 0.5f;
  p = p * y + 1.0f;
  p = p * y + 1.0f;
  const I8 exponent_bits = (__builtin_convertvector(whole, I8) + 127) << 23;
  return in_range ? p * __builtin_bit_cast(V8, exponent_bits) : V8{};
}

// One query head's step of the online softmax over a block: turns its scores s[0..n) into weights
// 2^(s - new max), s[n..kKeyBlock) into 0, updates the running max and sum, and returns the factor
// 2^(old max - new max) by which the head's outputs so far must be scaled.
inline __attribute__((always_inline)) float SoftmaxStep(float* s, int64_t n, float& running_max, float& running_sum) {
  static_assert(kKeyBlock == 16, "two vectors of scores");
  for (int64_t j = n; j < kKeyBlock; ++j) s[j] = -std::numeric_limits<float>::infinity();
  V8 low = Load<V8>(s), high = Load<V8>(s + 8);
  const V8 most = low > high ? low : high;
  float new_max = running_max;
  for (int l = 0; l < 8; ++l) new_max = std::max(new_max, most[l]);
  const float correction = Exp2(V8{} + (running_max - new_max))[0];
  low = Exp2(low - new_max);
  high = Exp2(high - new_max);
  Store(s, low);
  Store(s + 8, high);
  running_sum = running_sum * correction + HorizontalSum(low + high);
  running_max = new_max;
  return correction;
}

// s[j] *= scales[j] for a whole block, in two vectors. Lanes past a short block's keys hold
// leftovers that no one reads: SoftmaxStep overwrites their scores and AccumulateBlock stops at n.
inline __attribute__((always_inline)) void ScaleBlock(float* s, const float* scales) {
  static_assert(kKeyBlock == 16, "two vectors of scores");
  Store(s, Load<V8>(s) * Load<V8>(scales));
  Store(s + 8, Load<V8>(s + 8) * Load<V8>(scales + 8));
}

// Asks for the k and v of rows[first..last) (`elements` of each from the head's start) ahead of
// their use: a KV pool's slots lie scattered, so each row is a miss of its own, and a block's worth
// in flight at once hides their latency.
template <typename T>
inline __attribute__((always_inline)) void Prefetch(const T* k_head, const T* v_head, int64_t row_stride,
                                                    const int32_t* rows, int64_t first, int64_t last, int64_t elements) {
  constexpr int64_t kLineElements = 64 / sizeof(T);  // 64-byte cache lines
  for (int64_t j = first; j < last; ++j) {
    const int64_t row = rows ? rows[j] : j;
    for (int64_t d = 0; d < elements; d += kLineElements) {
      __builtin_prefetch(k_head + row * row_stride + d);
      __builtin_prefetch(v_head + row * row_stride + d);
    }
  }
}

// Scores of kQ query heads (at q, head_dim apart, pre-scaled) against kK keys: s[i * kKeyBlock +
// j] = q_i · keys[j]. Each vector of a key's dims is loaded once for the kQ heads, and the kQ × kK
// sums run as independent chains.
template <typename Vec, int kQ, int kK, typename T>
inline __attribute__((always_inline)) void ScoreKeys(const float* q, const T* const* keys, int64_t head_dim, float* s) {
  Vec acc[kQ][kK] = {};
  int64_t d = 0;
  for (; d + kLanes<Vec> <= head_dim; d += kLanes<Vec>) {
    Vec key[kK];
    for (int j = 0; j < kK; ++j) key[j] = Load<Vec>(keys[j] + d);
    for (int i = 0; i < kQ; ++i) {
      const Vec query = Load<Vec>(q + i * head_dim + d);
      for (int j = 0; j < kK; ++j) acc[i][j] += query * key[j];
    }
  }
  for (int i = 0; i < kQ; ++i) {
    float sums[kK];
    if constexpr (kK == 4) {
      Sum4(Fold(acc[i][0]), Fold(acc[i][1]), Fold(acc[i][2]), Fold(acc[i][3]), sums);
    } else {
      for (int j = 0; j < kK; ++j) sums[j] = HorizontalSum(acc[i][j]);
    }
    for (int64_t t = d; t < head_dim; ++t) {
      // Fused explicitly, here and in AccumulateBlock's dims left over, so that the compiler's
      // choice to fuse or not cannot differ between a float cache and a bfloat16 one.
      for (int j = 0; j < kK; ++j) sums[j] = __builtin_fmaf(q[i * head_dim + t], ToFloat(keys[j][t]), sums[j]);
    }
    for (int j = 0; j < kK; ++j) s[i * kKeyBlock + j] = sums[j];
  }
}

// kQ query heads' scores against keys[0..n), four keys at a time.
template <typename Vec, int kQ, typename T>
inline __attribute__((always_inline)) void ScoreBlock(const float* q, const T* const* keys, int64_t n, int64_t head_dim,
                                                      float* s) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) ScoreKeys<Vec, kQ, 4>(q, keys + j, head_dim, s + j);
  for (; j < n; ++j) ScoreKeys<Vec, kQ, 1>(q, keys + j, head_dim, s + j);
}

// o_i[d, d + kV vectors) = o_i[...] · correction[i] + sum over j < n of p[i * kKeyBlock + j] ·
// values[j][...], for kQ output rows o_i (at o, head_dim apart): the outputs held in registers
// across the block's keys, each value vector loaded once for the kQ heads.
template <typename Vec, int kQ, int kV, typename T>
inline __attribute__((always_inline)) void AccumulateDims(const float* p, const T* const* values, int64_t n, int64_t d,
                                                          int64_t head_dim, const float* correction, float* o) {
  constexpr int kL = kLanes<Vec>;
  Vec acc[kQ][kV];
  for (int i = 0; i < kQ; ++i) {
    for (int l = 0; l < kV; ++l) acc[i][l] = Load<Vec>(o + i * head_dim + d + kL * l) * correction[i];
  }
  for (int64_t j = 0; j < n; ++j) {
    Vec weight[kQ];
    for (int i = 0; i < kQ; ++i) weight[i] = Vec{} + p[i * kKeyBlock + j];
    for (int l = 0; l < kV; ++l) {
      const Vec value = Load<Vec>(values[j] + d + kL * l);
      for (int i = 0; i < kQ; ++i) acc[i][l] += weight[i] * value;
    }
  }
  for (int i = 0; i < kQ; ++i) {
    for (int l = 0; l < kV; ++l) Store(o + i * head_dim + d + kL * l, acc[i][l]);
  }
}

// AccumulateDims over all of head_dim: four vectors of dims at a time, then one, then one dim.
template <typename Vec, int kQ, typename T>
inline __attribute__((always_inline)) void AccumulateBlock(const float* p, const T* const* values, int64_t n,
                                                           int64_t head_dim, const float* correction, float* o) {
  constexpr int kL = kLanes<Vec>;
  int64_t d = 0;
  for (; d + 4 * kL <= head_dim; d += 4 * kL) AccumulateDims<Vec, kQ, 4>(p, values, n, d, head_dim, correction, o);
  for (; d + kL <= head_dim; d += kL) AccumulateDims<Vec, kQ, 1>(p, values, n, d, head_dim, correction, o);
  for (; d < head_dim; ++d) {
    for (int i = 0; i < kQ; ++i) {
      float sum = o[i * head_dim + d] * correction[i];
      for (int64_t j = 0; j < n; ++j) sum = __builtin_fmaf(p[i * kKeyBlock + j], ToFloat(values[j][d]), sum);
      o[i * head_dim + d] = sum;
    }
  }
}

// One work item of attention: `heads` consecutive KV heads' query heads, `group` each (query head
// i is row i of q, `q_head_stride` apart, and reads KV head i / group), attending to keys
// rows[begin..end) (rows == nullptr means row i is i); the normalised outputs go to out (query
// head i at out + i * out_head_stride). Row r of KV head h is at k_head (v_head) + r * row_stride
// + h * head_dim. T: float, uint16_t for bfloat16 (widened to float as it is read) or uint8_t for
// float8 e4m3: a block's rows of a head are widened first (`widen`, to 1/256 of their values,
// float8_rows.h), and row r's head h is scaled by 256 × k_scales (v_scales)[r * scale_stride + h].
template <typename T>
struct HeadsTask {
  const float* q;
  int64_t q_head_stride;
  int64_t group;
  int64_t heads;
  const T* k_head;
  const T* v_head;
  int64_t row_stride;
  const int32_t* rows;
  int64_t begin;
  int64_t end;
  int64_t head_dim;
  float* out;
  int64_t out_head_stride;
  const float* k_scales = nullptr;  // float8 only (unread for other types, as are the three below)
  const float* v_scales = nullptr;
  int64_t scale_stride = 0;
  WidenFloat8RowsFn widen = nullptr;
};

// Whether a cache of T keeps a scale per (slot, kv head): float8's does.
template <typename T>
constexpr bool kScaled = sizeof(T) == 1;

// Runs a HeadsTask. The heads of one row lie side by side, so taking several together reads whole
// rows. Scores are kept in log2 units (the queries pre-scaled by log2(e) / sqrt(head_dim)), so the
// softmax runs on Exp2. Keys go in blocks of kKeyBlock; for each block and KV head, the scores of
// four query heads at a time with AVX-512, else two (ScoreBlock), the softmax's running max and
// sum, then the weighted values (AccumulateBlock, which also rescales the outputs to the new max).
template <typename Vec, typename T>
inline __attribute__((always_inline)) void AttendHeads(const HeadsTask<T>& task) {
  const auto [q, q_head_stride, group, heads, k_head, v_head, row_stride, rows, begin, end, head_dim, out,
              out_head_stride, k_scales, v_scales, scale_stride, widen] = task;
  const int64_t q_heads = heads * group;
  const float scale = 1.4426950409f / std::sqrt(static_cast<float>(head_dim));
  // Per-thread scratch, reused across calls: the decode path allocates nothing once warm.
  thread_local std::vector<float> queries, running_max, running_sum, correction, acc, scores;
  queries.resize(q_heads * head_dim);
  for (int64_t i = 0; i < q_heads; ++i) {
    for (int64_t d = 0; d < head_dim; ++d) queries[i * head_dim + d] = q[i * q_head_stride + d] * scale;
  }
  running_max.assign(q_heads, -std::numeric_limits<float>::infinity());
  running_sum.assign(q_heads, 0.0f);
  correction.resize(q_heads);
  acc.assign(q_heads * head_dim, 0.0f);
  scores.resize(q_heads * kKeyBlock);

  // Four query heads of a group scored and accumulated together where 32 vector registers hold
  // their 4 x 4 tile of sums (AVX-512): each key and value is then loaded (and a bfloat16 one
  // widened) once for the four. Sixteen registers (AVX2) hold two heads' tiles.
  constexpr bool kFourHeads = kLanes<Vec> >= 16;
  const int64_t row_floats = heads * head_dim;
  // The rows scored and summed: the cache's own, or (float8) a block's widened rows of a head,
  // keys then values, with their scales.
  using Row = std::conditional_t<kScaled<T>, float, T>;
  const Row* keys[kKeyBlock];
  const Row* values[kKeyBlock];
  thread_local std::vector<float> widened;
  float key_scales[kKeyBlock] = {}, value_scales[kKeyBlock] = {};
  if constexpr (kScaled<T>) widened.resize(2 * kKeyBlock * head_dim);
  Prefetch(k_head, v_head, row_stride, rows, begin, std::min(end, begin + kKeyBlock), row_floats);
  for (int64_t block = begin; block < end; block += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, end - block);
    for (int64_t h = 0; h < heads; ++h) {
      // The next block's share of this head, asked for a head at a time rather than all at once:
      // a burst of misses (a block of whole rows is up to hundreds of lines) stalls the loads that
      // the work in between needs.
      Prefetch(k_head + h * head_dim, v_head + h * head_dim, row_stride, rows, block + kKeyBlock,
               std::min(end, block + 2 * kKeyBlock), head_dim);
      if constexpr (kScaled<T>) {
        const T* key_codes[kKeyBlock];
        const T* value_codes[kKeyBlock];
        for (int64_t j = 0; j < n; ++j) {
          const int64_t row = rows ? rows[block + j] : block + j;
          key_codes[j] = k_head + row * row_stride + h * head_dim;
          value_codes[j] = v_head + row * row_stride + h * head_dim;
          key_scales[j] = k_scales[row * scale_stride + h] * 256.0f;
          value_scales[j] = v_scales[row * scale_stride + h] * 256.0f;
          keys[j] = &widened[j * head_dim];
          values[j] = &widened[(kKeyBlock + j) * head_dim];
          if (h == 0 && block + kKeyBlock + j < end) {  // the next block's scales, one line a row
            const int64_t next = rows ? rows[block + kKeyBlock + j] : block + kKeyBlock + j;
            __builtin_prefetch(k_scales + next * scale_stride);
            __builtin_prefetch(v_scales + next * scale_stride);
          }
        }
        widen(key_codes, n, head_dim, &widened[0]);
        widen(value_codes, n, head_dim, &widened[kKeyBlock * head_dim]);
      } else {
        for (int64_t j = 0; j < n; ++j) {
          const int64_t row = rows ? rows[block + j] : block + j;
          keys[j] = k_head + row * row_stride + h * head_dim;
          values[j] = v_head + row * row_stride + h * head_dim;
        }
      }
      const int64_t first = h * group, last = first + group;
      int64_t i = first;
      if constexpr (kFourHeads) {
        for (; i + 4 <= last; i += 4) {
          ScoreBlock<Vec, 4>(&queries[i * head_dim], keys, n, head_dim, &scores[i * kKeyBlock]);
        }
      }
      for (; i + 2 <= last; i += 2) {
        ScoreBlock<Vec, 2>(&queries[i * head_dim], keys, n, head_dim, &scores[i * kKeyBlock]);
      }
      if (i < last) ScoreBlock<Vec, 1>(&queries[i * head_dim], keys, n, head_dim, &scores[i * kKeyBlock]);
      for (i = first; i < last; ++i) {
        // A float8 key's score is its scale times the score of its codes' values; its value's
        // weight (after the softmax has summed the weights) is scaled by the value's scale.
        if constexpr (kScaled<T>) {
          ScaleBlock(&scores[i * kKeyBlock], key_scales);
        }
        correction[i] = SoftmaxStep(&scores[i * kKeyBlock], n, running_max[i], running_sum[i]);
        if constexpr (kScaled<T>) {
          ScaleBlock(&scores[i * kKeyBlock], value_scales);
        }
      }
      i = first;
      if constexpr (kFourHeads) {
        for (; i + 4 <= last; i += 4) {
          AccumulateBlock<Vec, 4>(&scores[i * kKeyBlock], values, n, head_dim, &correction[i], &acc[i * head_dim]);
        }
      }
      for (; i + 2 <= last; i += 2) {
        AccumulateBlock<Vec, 2>(&scores[i * kKeyBlock], values, n, head_dim, &correction[i], &acc[i * head_dim]);
      }
      if (i < last) {
        AccumulateBlock<Vec, 1>(&scores[i * kKeyBlock], values, n, head_dim, &correction[i], &acc[i * head_dim]);
      }
    }
  }
  for (int64_t i = 0; i < q_heads; ++i) {
    const float inv = running_sum[i] > 0 ? 1.0f / running_sum[i] : 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) out[i * out_head_stride + d] = acc[i * head_dim + d] * inv;
  }
}

// AttendHeads compiled for each instruction set (isa.h) and element type.
template <typename T>
__attribute__((target("arch=x86-64-v4"))) void AttendHeadsAvx512(const HeadsTask<T>& task) {
  AttendHeads<V16>(task);
}
template <typename T>
__attribute__((target("arch=x86-64-v3"))) void AttendHeadsAvx2(const HeadsTask<T>& task) {
  AttendHeads<V8>(task);
}
template <typename T>
void AttendHeadsBaseline(const HeadsTask<T>& task) {
  AttendHeads<V8>(task);
}

template <typename T>
using AttendHeadsFn = void (*)(const HeadsTask<T>&);

template <typename T>
AttendHeadsFn<T> AttendHeadsFor(Isa isa) {
  return isa == Isa::kAvx512 ? AttendHeadsAvx512<T> : isa == Isa::kAvx2 ? AttendHeadsAvx2<T> : AttendHeadsBaseline<T>;
}

// DecodeAttention over a cache of T (the public overloads below).
// k_scales and v_scales: float8's, [slots, num_kv_heads]; nullptr for other caches.
template <typename T>
void DecodeAttentionOf(const AttentionShape& shape, const float* q, int64_t q_stride, const T* k_cache,
                       const T* v_cache, int64_t kv_stride, const float* k_scales, const float* v_scales,
                       const int32_t* slot_ids, const int64_t* slot_begin, float* out, int64_t out_stride,
                       int64_t num_seqs, ThreadPool& pool) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  const int64_t d = shape.head_dim;
  // A work item takes a sequence's kv heads [first, first + heads): all of them when the batch
  // alone keeps every thread busy, so that each slot's row is read whole, else fewer.
  const int64_t wanted_items = 4 * pool.num_threads();
  const int64_t splits = std::clamp<int64_t>((wanted_items + num_seqs - 1) / std::max<int64_t>(1, num_seqs), 1,
                                             shape.num_kv_heads);
  const int64_t heads = (shape.num_kv_heads + splits - 1) / splits;
  const int64_t items_per_seq = (shape.num_kv_heads + heads - 1) / heads;
  const AttendHeadsFn<T> attend_heads = AttendHeadsFor<T>(ActiveIsa());
  const WidenFloat8RowsFn widen = WidenFloat8RowsFor(ActiveIsa());
  pool.ParallelFor(num_seqs * items_per_seq, [&](int64_t item) {
    const int64_t s = item / items_per_seq;
    const int64_t first = item % items_per_seq * heads;
    const int64_t count = std::min(heads, shape.num_kv_heads - first);
    int64_t begin = slot_begin[s];
    const int64_t end = slot_begin[s + 1];
    if (shape.sliding_window > 0) begin = std::max(begin, end - shape.sliding_window);
    attend_heads({q + s * q_stride + first * group * d, d, group, count, k_cache + first * d, v_cache + first * d,
                  kv_stride, slot_ids, begin, end, d, out + s * out_stride + first * group * d, d,
                  k_scales ? k_scales + first : nullptr, v_scales ? v_scales + first : nullptr, shape.num_kv_heads,
                  widen});
  });
}

}  // namespace

void PrefillAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k, const float* v,
                      int64_t kv_stride, float* out, int64_t out_stride, int64_t num_tokens, ThreadPool& pool) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  const int64_t d = shape.head_dim;
  const AttendHeadsFn<float> attend_heads = AttendHeadsFor<float>(ActiveIsa());
  // Work items: (kv head, query token); later tokens cost more, so interleave them.
  pool.ParallelFor(shape.num_kv_heads * num_tokens, [&](int64_t item) {
    const int64_t kv_head = item % shape.num_kv_heads;
    const int64_t t = item / shape.num_kv_heads;
    const int64_t begin = shape.sliding_window > 0 ? std::max<int64_t>(0, t + 1 - shape.sliding_window) : 0;
    attend_heads({q + t * q_stride + kv_head * group * d, d, group, 1, k + kv_head * d, v + kv_head * d, kv_stride,
                  nullptr, begin, t + 1, d, out + t * out_stride + kv_head * group * d, d});
  });
}

void DecodeAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k_cache,
                     const float* v_cache, int64_t kv_stride, const int32_t* slot_ids, const int64_t* slot_begin,
                     float* out, int64_t out_stride, int64_t num_seqs, ThreadPool& pool) {
  DecodeAttentionOf(shape, q, q_stride, k_cache, v_cache, kv_stride, nullptr, nullptr, slot_ids, slot_begin, out,
                    out_stride, num_seqs, pool);
}

void DecodeAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const uint16_t* k_cache,
                     const uint16_t* v_cache, int64_t kv_stride, const int32_t* slot_ids, const int64_t* slot_begin,
                     float* out, int64_t out_stride, int64_t num_seqs, ThreadPool& pool) {
  DecodeAttentionOf(shape, q, q_stride, k_cache, v_cache, kv_stride, nullptr, nullptr, slot_ids, slot_begin, out,
                    out_stride, num_seqs, pool);
}

void DecodeAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const uint8_t* k_cache,
                     const uint8_t* v_cache, int64_t kv_stride, const float* k_scales, const float* v_scales,
                     const int32_t* slot_ids, const int64_t* slot_begin, float* out, int64_t out_stride,
                     int64_t num_seqs, ThreadPool& pool) {
  DecodeAttentionOf(shape, q, q_stride, k_cache, v_cache, kv_stride, k_scales, v_scales, slot_ids, slot_begin, out,
                    out_stride, num_seqs, pool);
}

}  // namespace lamina::kernels::cpu
