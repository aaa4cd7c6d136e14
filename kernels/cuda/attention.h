// CUDA attention, the sibling of kernels/cpu/attention.h, over a bf16 or a float8 e4m3 KV cache.
//
// Decode attention reads a token-granular cache laid out [slot][kv_head][head_dim] per layer. It is
// GQA-aware (each KV head is read once for its whole group of query heads) and, when the batch is
// too small to fill the GPU, splits each sequence's context across thread blocks and merges the
// partial softmax results (flash-decoding). Prefill attention is FlashAttention-2 style: query
// tiles per block, key/value tiles in shared memory, online softmax, rows split across warps.
//
// A float8 cache (Float8KvLayer) keeps each token's heads as e4m3 codes with a float scale per
// (slot, kv head), quantized as the CPU's pool is (QuantizeFloat8E4M3, common/tensor/float8.h),
// so that both hold the same bits. Its decode is tiled only: each lane widens the codes of its
// products' fragments to bf16 in registers (exactly: every e4m3 value is a bf16 one), and the key
// scales multiply the scores and the value scales the softmax weights.
//
// Supported: head_dim 16, 32, 64 or 128; up to 8 query heads per KV head. Anything else is
// InvalidArgument naming the value. Launchers queue work on `stream` and never synchronize.
// DecodeAttention and StoreKv are chained (chaining.h); the linked launch is not. Thread-safe.
#ifndef LAMINA_KERNELS_CUDA_ATTENTION_H_
#define LAMINA_KERNELS_CUDA_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/line.h"
#include "kernels/cuda/packets.h"

namespace lamina::kernels::cuda {

using bf16 = __nv_bfloat16;
using kernels::cpu::AttentionShape;

// One layer of a float8 e4m3 KV cache: codes laid out as a bf16 cache's values, and a scale per
// (slot, kv head); a value is its code's value × its head's scale.
struct Float8KvLayer {
  uint8_t* k_codes = nullptr;  // [num_slots, kv_heads, head_dim]
  uint8_t* v_codes = nullptr;
  float* k_scales = nullptr;  // [num_slots, kv_heads]
  float* v_scales = nullptr;
};

// How a decode launch lays out its work: what a block (or warp) of it attends to, and where.
enum class DecodeStrategy {
  // A block per (split, sequence, kv head) on the CUDA cores, loading the cache into registers.
  kBlockPerHead,
  // One warp per (sequence, kv head), four to a block, one split. Short contexts gain: a block's
  // fixed costs outweigh attention over a few tokens.
  kWarpPerHead,
  // A block per (split, sequence, kv head) on the tensor cores, streaming the cache through shared
  // memory in tiles of 64 tokens (splits then cut contexts in whole tiles), two tiles a block and
  // two blocks an SM.
  kTiled,
  // Tiled with four tiles in shared memory (three in flight) and a block alone on its SM: for
  // launches of at most one block an SM.
  kDeepTiled,
  // A block per (sequence, kv head) on the CUDA cores whose four warps share out its query heads
  // (a warp each, or two each at 8 a kv head; 5 to 7 are refused), one split: each warp attends to
  // its own heads, so that the path from a linked launch's inputs to its outputs is a quarter of a
  // warp per head's. For the short contexts of a launch that polls its own packets
  // (PlanPolledDecode).
  kWarpPerQueryHead,
};

// "block per head", "warp per head", "tiled", "deep tiles" or "warp per query head", for logs.
const char* DecodeStrategyName(DecodeStrategy strategy);

// How a decode call splits its work; from PlanDecode().
struct DecodePlan {
  DecodeStrategy strategy = DecodeStrategy::kBlockPerHead;
  int splits = 1;                // context chunks per (sequence, kv head), at most 1024; 1 for warps
  int64_t workspace_floats = 0;  // scratch the call needs (0 when splits == 1)
  // kWarpPerQueryHead: the pairs a block serves, 1, 2 or 4 (kMostPairsPerBlock), each with four
  // warps and barriers of its own, so that a launch of many pairs takes fewer, larger blocks. For
  // a spin budget that counts each polling block as an SM (kv/attention/spin_budget.h): a launch
  // that would not fit it as a block a pair may fit as fewer blocks. 1 for other strategies.
  int pairs_per_block = 1;

  bool tiled() const { return strategy == DecodeStrategy::kTiled || strategy == DecodeStrategy::kDeepTiled; }
  // A warp (or warps) per pair rather than a block per split and pair.
  bool by_warps() const {
    return strategy == DecodeStrategy::kWarpPerHead || strategy == DecodeStrategy::kWarpPerQueryHead;
  }
};

// The most (sequence, kv head) pairs a block of a kWarpPerQueryHead plan serves.
inline constexpr int kMostPairsPerBlock = 4;

// Whether a kWarpPerQueryHead plan serves `shape`: 1 to 4, or 8, query heads a kv head.
bool QueryHeadWarpsServe(const AttentionShape& shape);

// Plans a launch for `num_seqs` sequences whose longest attended context is `max_context`, on
// `num_sms` SMs: tiled, with splits that take the fewest turns of tiles over the waves of blocks
// the launch needs (counting a block's fixed costs and the merge of splits as about a tile each).
// Deep tiles, a block an SM, up to `num_sms` (sequence, kv head) pairs when `deep_tiles_fit` (the
// GPU allows a block their shared memory); else shallow ones, `blocks_per_sm` blocks an SM. At most
// 1024 splits. With one split and no context longer than 256 tokens: a warp per (sequence, kv
// head) from `num_sms` × 8 pairs, or from `num_sms` × 2 where the context is at most 10 tokens for
// each pair per SM; else, from `num_sms` × 2 pairs, a block each on the CUDA cores (not tiled).
DecodePlan PlanDecode(const AttentionShape& shape, int64_t num_seqs, int64_t max_context, int num_sms,
                      int blocks_per_sm, bool deep_tiles_fit = true);

// The same, with DecodeBlocksPerSm(shape) and whether deep tiles fit on the current GPU.
DecodePlan PlanDecode(const AttentionShape& shape, int64_t num_seqs, int64_t max_context, int num_sms);

// The plan for a linked launch whose warps or blocks poll their own packets (DecodeLink::packets),
// from `plan`, PlanDecode's for the same launch: a warp per (sequence, kv head) also from more
// pairs than half of `num_sms` (PlanDecode's floor is 2 an SM) where the context is at most 4
// tokens for each pair per SM. Each warp then attends as soon as its own packets are in. Then, up
// to 8 pairs an SM in one split, where a warp per query head serves the shape: a warp per query
// head where the context is at most 16 tokens or the pick so far is a warp per pair.
DecodePlan PlanPolledDecode(const AttentionShape& shape, const DecodePlan& plan, int64_t num_seqs,
                            int64_t max_context, int num_sms);

// `plan` for a float8 cache, whose decode is tiled only: a warp per head or query head, or a
// CUDA-core plan, becomes a tiled one of one split (shallow tiles), its block count DecodeBlocks'
// again.
DecodePlan Float8Plan(const DecodePlan& plan);

// How many blocks of the tiled decode kernel for `shape` one SM of the current GPU holds at once;
// asked of the GPU once per device. 2 without a GPU, 1 for shapes DecodeAttention refuses.
int DecodeBlocksPerSm(const AttentionShape& shape);

// How many blocks of a linked launch under `plan` that polls its own packets one SM of the current
// GPU holds at once, for a kWarpPerHead or kWarpPerQueryHead plan (128 threads a pair and the
// packets they stage a block: many share an SM, fewer the more pairs a block serves); asked of the
// GPU once per device. 1 for other plans, for shapes DecodeAttention refuses, and without a GPU.
int PolledBlocksPerSm(const AttentionShape& shape, const DecodePlan& plan);

// The thread blocks of a decode launch under `plan`.
int64_t DecodeBlocks(const AttentionShape& shape, const DecodePlan& plan, int64_t num_seqs);

// One query per sequence against its cached keys: sequence s attends to the slots
// slot_ids[slot_begin[s] .. slot_begin[s + 1]) in position order (the last `sliding_window` of
// them when set).
// Chained (chaining.h), with one exception to a chained kernel's rule: a tiled plan reads
// slot_ids, slot_begin and the cached k/v of every context token but its last before the kernel
// ahead of it has ended. So no chained kernel queued since the stream's last unchained work may
// write those; StoreKv of each sequence's new token, the last, may.
absl::Status DecodeAttention(const AttentionShape& shape, const DecodePlan& plan,
                             const float* q, int64_t q_stride,         // [num_seqs, q_stride], heads first
                             const bf16* k_cache, const bf16* v_cache,  // [num_slots, kv_heads, head_dim]
                             const int32_t* slot_ids,                   // [total context tokens]
                             const int32_t* slot_begin,                 // [num_seqs + 1]
                             float* out, int64_t out_stride,            // [num_seqs, out_stride]
                             int64_t num_seqs,
                             float* workspace,  // [plan.workspace_floats] or nullptr when 0
                             cudaStream_t stream);

// The same over a float8 cache, whose values are code × scale; InvalidArgument for a plan that is
// not tiled (Float8Plan makes one).
absl::Status DecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                             const Float8KvLayer& cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                             int64_t out_stride, int64_t num_seqs, float* workspace, cudaStream_t stream);

// The data-plane hop folded into a linked decode attention launch (LinkedDecodeAttention).
struct DecodeLink {
  // Before anything is read: wait until *ready >= ready_value (acquire, system scope). After
  // `timeout_ns` the launch stops waiting, sets *error = error_code (when still 0) and runs on
  // whatever is there. Null `ready`: the inputs are in place already (ordered on the stream).
  const uint64_t* ready = nullptr;
  uint64_t ready_value = 0;
  int64_t timeout_ns = 0;
  uint32_t* error = nullptr;  // may be pinned host memory
  uint32_t error_code = 0;
  // Each sequence's new k and v rows (float32, heads first), stored as bf16 (or as float8 codes and
  // scales, as StoreKv does) at write_slots[s], which must be the last slot of the sequence's
  // context.
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_stride = 0;
  const int32_t* write_slots = nullptr;  // [num_seqs]
  // Once every output row is written: *done = done_value (release, system scope), unless *error
  // is set. `done` and `out` may be a peer GPU's memory (mapped through CUDA IPC). May be null
  // with out_lines (the peer polls the lines), or where a kernel queued after the launch sends the
  // outputs on (a memory node's packets, packets.h): then nothing fences at the end, and the
  // launch ends, and the next may start, as soon as its outputs are stored.
  uint64_t* done = nullptr;
  uint64_t done_value = 0;
  // Lines (line.h) for a hop of a few rows, each side on its own:
  //  - with `lines`, the inputs arrive as lines tagged `line_tag`, mirroring the floats from
  //    `lines_mirror` on, among which q, k and v lie; each block polls the lines of what it reads
  //    (its query heads, and the new token's k and v where it stores them) and takes their floats
  //    from the lines, leaving q, k and v unwritten, instead of waiting on `ready` (null then),
  //    giving up as its wait would;
  //  - with `out_lines`, the outputs are written as lines tagged `line_tag`, mirroring `out` from
  //    its start, instead of into `out`. The done flag is raised all the same.
  // Not with a kWarpPerHead or kWarpPerQueryHead plan.
  const Line* lines = nullptr;
  const float* lines_mirror = nullptr;
  Line* out_lines = nullptr;
  uint32_t line_tag = 0;  // of lines or packets
  // Packets (packets.h) for a hop of many rows between GPUs joined by NVLink, each side on its own:
  //  - with `packets`, the inputs arrive as packets tagged `line_tag`, packet row s mirroring row s
  //    of the floats from `packets_mirror` on (rows of q_stride floats, PacketsPerRow(q_stride)
  //    packets each; kv_stride must equal q_stride), among which q, k and v lie; each block (a
  //    warp per head: each warp) polls the packets of what it reads, as with lines, instead of
  //    waiting on `ready` (null then);
  //  - with `out_packets`, the outputs go as packets tagged `line_tag`, row s in num_kv_heads parts
  //    (PacketsPerRow(num_q_heads * head_dim, num_kv_heads) packets a row), each kv head's written
  //    by the block (or warp) that finishes it, instead of into `out`. Nothing is sent once a wait
  //    of the step gave up.
  // Not with lines.
  const Packet* packets = nullptr;
  const float* packets_mirror = nullptr;
  Packet* out_packets = nullptr;
  // The launch is chained (chaining.h) to a wait for its inputs queued just before it on its
  // stream (WaitFlag on `ready`, ReceiveLines with NextKernel::kStartsOnceIn on `lines`, or
  // WaitForFirstPacket on `packets`; data_plane.h, packets.h), which lets it start once the inputs
  // have come or are on their way: its blocks hold no SM while the sender is busy, yet read the
  // slot tables and queue their first tiles while the wait ends. With `ready`, `lines` or
  // `packets` set, the blocks then find them there themselves; with all null, they wait for the
  // wait's end and read what it put in place.
  bool chained_to_wait = false;
  // Zeroed device words, LinkedDecodeCounters() of them; the launch leaves them zeroed.
  uint32_t* counters = nullptr;
  // Optional, two device words that launches running side by side may share: busy_ns[0] grows by
  // the time from the launch's inputs' arrival to its done flag (GPU clock) that no launch counted
  // yet, busy_ns[1] is the latest end counted (so overlapping launches count their overlap once,
  // give or take launches that end out of order). `busy_start` is the launch's own scratch word,
  // required with busy_ns.
  uint64_t* busy_ns = nullptr;
  uint64_t* busy_start = nullptr;
};

// The counter words a linked launch over `num_seqs` sequences needs.
int64_t LinkedDecodeCounters(const AttentionShape& shape, int64_t num_seqs);

// DecodeAttention with the data-plane hop around it in the same launch: wait for the inputs, store
// the new tokens' k/v, attend, write the outputs (to a peer GPU when `out` is mapped), raise the
// done flag. Same results as StoreKv + DecodeAttention. With `link.ready` set every block waits,
// so keep the grid (DecodeBlocks) within one wave, or queue the wait
// ahead (WaitFlag) and leave `ready` null. InvalidArgument when num_seqs is 0 or a link field is
// missing.
absl::Status LinkedDecodeAttention(const AttentionShape& shape, const DecodePlan& plan,
                                   const float* q, int64_t q_stride,  // [num_seqs, q_stride]
                                   bf16* k_cache, bf16* v_cache,      // [num_slots, kv_heads, head_dim]
                                   const int32_t* slot_ids, const int32_t* slot_begin,
                                   float* out, int64_t out_stride,    // [num_seqs, out_stride]
                                   int64_t num_seqs, float* workspace, const DecodeLink& link,
                                   cudaStream_t stream);

// The same over a float8 cache (InvalidArgument for a plan that is not tiled).
absl::Status LinkedDecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q,
                                   int64_t q_stride,  // [num_seqs, q_stride]
                                   const Float8KvLayer& cache, const int32_t* slot_ids, const int32_t* slot_begin,
                                   float* out, int64_t out_stride,  // [num_seqs, out_stride]
                                   int64_t num_seqs, float* workspace, const DecodeLink& link, cudaStream_t stream);

// Causal self-attention over one prompt: query t attends to keys 0..t (the last `sliding_window`
// of them when set). On the tensor cores: q, k and v rounded to bf16 (as the KV cache holds k and
// v), products and softmax in float32. Rows must be 16-byte aligned (strides a multiple of 4
// floats) and out's 8-byte aligned, else InvalidArgument.
absl::Status PrefillAttention(const AttentionShape& shape,
                              const float* q, int64_t q_stride,  // [tokens, q_stride]
                              const float* k, const float* v,    // [tokens, kv_stride]
                              int64_t kv_stride,
                              float* out, int64_t out_stride,    // [tokens, out_stride]
                              int64_t num_tokens, cudaStream_t stream);

// The same in float32 on the CUDA cores (no alignment needed): the reference the benchmarks and
// tests compare the tensor-core kernel with.
absl::Status PrefillAttentionOnCudaCores(const AttentionShape& shape, const float* q, int64_t q_stride,
                                         const float* k, const float* v, int64_t kv_stride, float* out,
                                         int64_t out_stride, int64_t num_tokens, cudaStream_t stream);

// Writes k and v rows (float32, heads first) into the cache at the given slots, as bf16.
absl::Status StoreKv(const float* k, const float* v, int64_t row_stride,  // [count, row_stride]
                     const int32_t* slots,                                 // [count]
                     bf16* k_cache, bf16* v_cache,                        // [num_slots, kv_heads, head_dim]
                     int64_t count, int64_t kv_size, cudaStream_t stream);

// The same into a float8 cache: each head of each row quantized as QuantizeFloat8E4M3
// (common/tensor/float8.h) quantizes it, to the same codes and scales. InvalidArgument for a
// head_dim past 128.
absl::Status StoreKv(const float* k, const float* v, int64_t row_stride,  // [count, row_stride]
                     const int32_t* slots,                                // [count]
                     const Float8KvLayer& cache, int64_t count, int64_t kv_heads, int64_t head_dim,
                     cudaStream_t stream);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_ATTENTION_H_
