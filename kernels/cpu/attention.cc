#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace lamina::kernels::cpu {
namespace {

// Keys are scored in blocks; each block updates the running max, the sum and the output.
constexpr int64_t kKeyBlock = 32;

// Attends `group` query heads (rows of q, `q_head_stride` apart) to keys rows[begin..end) of one KV
// head and writes the normalised outputs. rows == nullptr means row i is i.
void AttendGroup(const float* q, int64_t q_head_stride, int64_t group, const float* k_head,
                 const float* v_head, int64_t row_stride, const int32_t* rows, int64_t begin,
                 int64_t end, int64_t head_dim, float* out, int64_t out_head_stride) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // Per-thread scratch, reused across calls: the decode path allocates nothing once warm.
  thread_local std::vector<float> running_max, running_sum, acc, scores;
  running_max.assign(group, -std::numeric_limits<float>::infinity());
  running_sum.assign(group, 0.0f);
  acc.assign(group * head_dim, 0.0f);
  scores.resize(group * kKeyBlock);

  for (int64_t block = begin; block < end; block += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, end - block);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = rows ? rows[block + j] : block + j;
      const float* key = k_head + row * row_stride;
      for (int64_t g = 0; g < group; ++g) {
        const float* query = q + g * q_head_stride;
        float dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += query[d] * key[d];
        scores[g * kKeyBlock + j] = dot * scale;
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      float* s = &scores[g * kKeyBlock];
      float block_max = *std::max_element(s, s + n);
      float new_max = std::max(running_max[g], block_max);
      float correction = std::exp(running_max[g] - new_max);
      running_sum[g] *= correction;
      float* a = &acc[g * head_dim];
      for (int64_t d = 0; d < head_dim; ++d) a[d] *= correction;
      for (int64_t j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - new_max);
        running_sum[g] += s[j];
      }
      running_max[g] = new_max;
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = rows ? rows[block + j] : block + j;
      const float* value = v_head + row * row_stride;
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * kKeyBlock + j];
        float* a = &acc[g * head_dim];
        for (int64_t d = 0; d < head_dim; ++d) a[d] += p * value[d];
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float inv = running_sum[g] > 0 ? 1.0f / running_sum[g] : 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) out[g * out_head_stride + d] = acc[g * head_dim + d] * inv;
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
    AttendGroup(q + t * q_stride + kv_head * group * d, d, group, k + kv_head * d, v + kv_head * d,
                kv_stride, nullptr, begin, t + 1, d, out + t * out_stride + kv_head * group * d, d);
  });
}

void DecodeAttention(const AttentionShape& shape, const float* q, int64_t q_stride, const float* k_cache,
                     const float* v_cache, int64_t kv_stride, const int32_t* slot_ids,
                     const int64_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                     ThreadPool& pool) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  const int64_t d = shape.head_dim;
  pool.ParallelFor(num_seqs * shape.num_kv_heads, [&](int64_t item) {
    const int64_t s = item / shape.num_kv_heads;
    const int64_t kv_head = item % shape.num_kv_heads;
    int64_t begin = slot_begin[s];
    const int64_t end = slot_begin[s + 1];
    if (shape.sliding_window > 0) begin = std::max(begin, end - shape.sliding_window);
    AttendGroup(q + s * q_stride + kv_head * group * d, d, group, k_cache + kv_head * d,
                v_cache + kv_head * d, kv_stride, slot_ids, begin, end, d,
                out + s * out_stride + kv_head * group * d, d);
  });
}

}  // namespace lamina::kernels::cpu
