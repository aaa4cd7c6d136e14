// Attention on the CPU with online softmax (one pass over keys, running max and sum), GQA-aware:
// each KV head's keys and values are read once for its whole group of query heads.
//
// Keys and values live in "row" storage: row r of head h is at base + r * row_stride + h * head_dim.
// Prefill reads the prompt's own rows (row = token index); decode reads a KV cache through slot ids
// (row = slot), whose values may be float32, bfloat16 or scaled float8 e4m3. Vectorised for AVX-512 and AVX2+FMA,
// chosen at run time (isa.h); results differ between the two by float rounding. Thread-safe; runs
// on the given pool.
#ifndef LAMINA_KERNELS_CPU_ATTENTION_H_
#define LAMINA_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

#include "common/threading/thread_pool.h"

namespace lamina::kernels::cpu {

struct AttentionShape {
  int64_t num_q_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t sliding_window = 0;  // 0: none; else a query sees the last `sliding_window` positions
};

// Causal self-attention over one prompt: query t attends to keys 0..t.
void PrefillAttention(const AttentionShape& shape,
                      const float* q, int64_t q_stride,   // [tokens, q_stride], heads first
                      const float* k, const float* v,     // [tokens, kv_stride], heads first
                      int64_t kv_stride,
                      float* out, int64_t out_stride,     // [tokens, out_stride], heads first
                      int64_t num_tokens, ThreadPool& pool = ThreadPool::Default());

// One query token per sequence against its cached keys. Sequence s attends to the rows
// slot_ids[slot_begin[s] .. slot_begin[s + 1]) in position order.
void DecodeAttention(const AttentionShape& shape,
                     const float* q, int64_t q_stride,          // [num_seqs, q_stride]
                     const float* k_cache, const float* v_cache,  // [num_slots, kv_stride]
                     int64_t kv_stride,
                     const int32_t* slot_ids,    // [total context tokens]
                     const int64_t* slot_begin,  // [num_seqs + 1]
                     float* out, int64_t out_stride,  // [num_seqs, out_stride]
                     int64_t num_seqs, ThreadPool& pool = ThreadPool::Default());
// The same over a cache of bfloat16 values (their bits): each read widened to the float it stands
// for, exactly, so the result equals the float32 call's over those widened values, bit for bit.
void DecodeAttention(const AttentionShape& shape, const float* q, int64_t q_stride,  // [num_seqs, q_stride]
                     const uint16_t* k_cache, const uint16_t* v_cache,               // [num_slots, kv_stride] bfloat16
                     int64_t kv_stride,
                     const int32_t* slot_ids,         // [total context tokens]
                     const int64_t* slot_begin,       // [num_seqs + 1]
                     float* out, int64_t out_stride,  // [num_seqs, out_stride]
                     int64_t num_seqs, ThreadPool& pool = ThreadPool::Default());
// The same over a cache of float8 e4m3 values (their bits, common/tensor/float8.h) with a scale
// per (slot, kv head): slot r's head h stands for its codes' values times k_scales[r *
// num_kv_heads + h] (v_scales for values). Each code is widened exactly and the scales applied to
// the scores and the softmax weights, so the result equals the float32 call's over the products
// to within float rounding.
void DecodeAttention(const AttentionShape& shape, const float* q, int64_t q_stride,    // [num_seqs, q_stride]
                     const uint8_t* k_cache, const uint8_t* v_cache,                   // [num_slots, kv_stride] e4m3
                     int64_t kv_stride, const float* k_scales, const float* v_scales,  // [num_slots, num_kv_heads]
                     const int32_t* slot_ids,                                          // [total context tokens]
                     const int64_t* slot_begin,                                        // [num_seqs + 1]
                     float* out, int64_t out_stride,                                   // [num_seqs, out_stride]
                     int64_t num_seqs, ThreadPool& pool = ThreadPool::Default());

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_ATTENTION_H_
