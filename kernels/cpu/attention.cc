#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/vector8.h"

namespace lamina::kernels::cpu {
namespace {

// Keys are scored in blocks; each block updates the running max, the sum and the output.
constexpr int64_t kKeyBlock = 16;

// a · b over n floats: vectors of 8 in two chains, then the tail.
inline __attribute__((always_inline)) float Dot(const float* a, const float* b, int64_t n) {
  V8 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += Load8(a + i) * Load8(b + i);
    acc1 += Load8(a + i + 8) * Load8(b + i + 8);
  }
  if (i + 8 <= n) {
    acc0 += Load8(a + i) * Load8(b + i);
    i += 8;
  }
  float sum = HorizontalSum(acc0 + acc1);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += p · x over n floats.
inline __attribute__((always_inline)) void Axpy(float p, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  const V8 pv = V8{} + p;
  for (; i + 8 <= n; i += 8) Store8(y + i, Load8(y + i) + pv * Load8(x + i));
  for (; i < n; ++i) y[i] += p * x[i];
}

// 2^x for x <= 0, exact at integers (2^0 = 1, so a single key's weight is exactly 1); 0 for x at
// or below -126 (-inf included). Plain arithmetic, so that a loop over it vectorizes: 2^x = 2^n ·
// e^((x - n) ln 2) with n the nearest integer, the second factor by its Taylor series to degree 7
// (|x - n| <= 1/2: the series' relative error is below 6e-9, float rounding aside).
inline __attribute__((always_inline)) float Exp2(float x) {
  const bool underflow = !(x > -126.0f);  // -inf too
  x = underflow ? -126.0f : x;
  const float whole = __builtin_floorf(x + 0.5f);
  const float y = (x - whole) * 0.69314718056f;
  float p = 1.0f / 5040;
  p = p * y + 1.0f / 720;
  p = p * y + 1.0f / 120;
  p = p * y + 1.0f / 24;
  p = p * y + 1.0f / 6;
  p = p * y + 0.5f;
  p = p * y + 1.0f;
  p = p * y + 1.0f;
  const int32_t exponent_bits = (static_cast<int32_t>(whole) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &exponent_bits, sizeof(scale));
  return underflow ? 0.0f : p * scale;
}

// Asks for the k and v of rows[first..last) (`floats` of each from the head's start) ahead of
// their use: a KV pool's slots lie scattered, so each row is a miss of its own, and a block's worth
// in flight at once hides their latency.
inline __attribute__((always_inline)) void Prefetch(const float* k_head, const float* v_head, int64_t row_stride,
                                                    const int32_t* rows, int64_t first, int64_t last,
                                                    int64_t floats) {
  constexpr int64_t kLineFloats = 16;  // 64-byte cache lines
  for (int64_t j = first; j < last; ++j) {
    const int64_t row = rows ? rows[j] : j;
    for (int64_t d = 0; d < floats; d += kLineFloats) {
      __builtin_prefetch(k_head + row * row_stride + d);
      __builtin_prefetch(v_head + row * row_stride + d);
    }
  }
}

// Attends `heads` consecutive KV heads' query heads, `group` each (query head i is row i of q,
// `q_head_stride` apart, and reads KV head i / group), to keys rows[begin..end) and writes the
// normalised outputs (query head i at out + i * out_head_stride). rows == nullptr means row i is
// i. The heads of one row lie side by side, so taking several together reads whole rows. Scores
// are kept in log2 units (the queries pre-scaled by log2(e) / sqrt(head_dim)), so the softmax runs
// on Exp2.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void AttendHeads(const float* q, int64_t q_head_stride, int64_t group, int64_t heads, const float* k_head,
                 const float* v_head, int64_t row_stride, const int32_t* rows, int64_t begin, int64_t end,
                 int64_t head_dim, float* out, int64_t out_head_stride) {
  const int64_t q_heads = heads * group;
  const float scale = 1.4426950409f / std::sqrt(static_cast<float>(head_dim));
  // Per-thread scratch, reused across calls: the decode path allocates nothing once warm.
  thread_local std::vector<float> queries, running_max, running_sum, acc, scores;
  queries.resize(q_heads * head_dim);
  for (int64_t i = 0; i < q_heads; ++i) {
    for (int64_t d = 0; d < head_dim; ++d) queries[i * head_dim + d] = q[i * q_head_stride + d] * scale;
  }
  running_max.assign(q_heads, -std::numeric_limits<float>::infinity());
  running_sum.assign(q_heads, 0.0f);
  acc.assign(q_heads * head_dim, 0.0f);
  scores.resize(q_heads * kKeyBlock);

  const int64_t row_floats = heads * head_dim;
  Prefetch(k_head, v_head, row_stride, rows, begin, std::min(end, begin + kKeyBlock), row_floats);
  for (int64_t block = begin; block < end; block += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, end - block);
    Prefetch(k_head, v_head, row_stride, rows, block + kKeyBlock, std::min(end, block + 2 * kKeyBlock), row_floats);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = rows ? rows[block + j] : block + j;
      const float* key_row = k_head + row * row_stride;
      for (int64_t i = 0; i < q_heads; ++i) {
        scores[i * kKeyBlock + j] = Dot(&queries[i * head_dim], key_row + i / group * head_dim, head_dim);
      }
    }
    for (int64_t i = 0; i < q_heads; ++i) {
      float* s = &scores[i * kKeyBlock];
      const float block_max = *std::max_element(s, s + n);
      const float new_max = std::max(running_max[i], block_max);
      const float correction = Exp2(running_max[i] - new_max);
      float* a = &acc[i * head_dim];
      for (int64_t d = 0; d < head_dim; ++d) a[d] *= correction;
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        s[j] = Exp2(s[j] - new_max);
        sum += s[j];
      }
      running_sum[i] = running_sum[i] * correction + sum;
      running_max[i] = new_max;
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = rows ? rows[block + j] : block + j;
      const float* value_row = v_head + row * row_stride;
      for (int64_t i = 0; i < q_heads; ++i) {
        Axpy(scores[i * kKeyBlock + j], value_row + i / group * head_dim, &acc[i * head_dim], head_dim);
      }
    }
  }
  for (int64_t i = 0; i < q_heads; ++i) {
    const float inv = running_sum[i] > 0 ? 1.0f / running_sum[i] : 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) out[i * out_head_stride + d] = acc[i * head_dim + d] * inv;
  }
}

}  // namespace

void PrefillAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k,
                      const float* v, int64_t kv_stride, float* out, int64_t out_stride,
                      int64_t num_tokens, ThreadPool& pool) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  const int64_t d = shape.head_dim;
  // Work items: (kv head, query token); later tokens cost more, so interleave them.
  pool.ParallelFor(shape.num_kv_heads * num_tokens, [&](int64_t item) {
    const int64_t kv_head = item % shape.num_kv_heads;
    const int64_t t = item / shape.num_kv_heads;
    const int64_t begin = shape.sliding_window > 0 ? std::max<int64_t>(0, t + 1 - shape.sliding_window) : 0;
    AttendHeads(q + t * q_stride + kv_head * group * d, d, group, 1, k + kv_head * d, v + kv_head * d, kv_stride,
                nullptr, begin, t + 1, d, out + t * out_stride + kv_head * group * d, d);
  });
}

void DecodeAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k_cache,
                     const float* v_cache, int64_t kv_stride, const int32_t* slot_ids,
                     const int64_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                     ThreadPool& pool) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  const int64_t d = shape.head_dim;
  // A work item takes a sequence's kv heads [first, first + heads): all of them when the batch
  // alone keeps every thread busy, so that each slot's row is read whole, else fewer.
  const int64_t wanted_items = 4 * pool.num_threads();
  const int64_t splits = std::clamp<int64_t>((wanted_items + num_seqs - 1) / std::max<int64_t>(1, num_seqs), 1,
                                             shape.num_kv_heads);
  const int64_t heads = (shape.num_kv_heads + splits - 1) / splits;
  const int64_t items_per_seq = (shape.num_kv_heads + heads - 1) / heads;
  pool.ParallelFor(num_seqs * items_per_seq, [&](int64_t item) {
    const int64_t s = item / items_per_seq;
    const int64_t first = item % items_per_seq * heads;
    const int64_t count = std::min(heads, shape.num_kv_heads - first);
    int64_t begin = slot_begin[s];
    const int64_t end = slot_begin[s + 1];
    if (shape.sliding_window > 0) begin = std::max(begin, end - shape.sliding_window);
    AttendHeads(q + s * q_stride + first * group * d, d, group, count, k_cache + first * d, v_cache + first * d,
                kv_stride, slot_ids, begin, end, d, out + s * out_stride + first * group * d, d);
  });
}

}  // namespace lamina::kernels::cpu
