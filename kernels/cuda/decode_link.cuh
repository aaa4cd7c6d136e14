// The data-plane hop of a linked decode launch (LinkedDecodeAttention, attention.h), device side:
// waiting for the inputs (a flag, a wait chained ahead, or lines polled by each block), storing the
// new token's k and v, writing the outputs (into rows, or as lines), merging a (sequence, kv head)'s
// splits in the launch, and the last block's done flag and busy time. For a decode block of
// kTileThreads threads. Include only from decode_attention.cu.
#ifndef LAMINA_KERNELS_CUDA_DECODE_LINK_CUH_
#define LAMINA_KERNELS_CUDA_DECODE_LINK_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/decode_tiles.cuh"
#include "kernels/cuda/flags.cuh"
#include "kernels/cuda/float8.cuh"
#include "kernels/cuda/lines.cuh"
#include "kernels/cuda/packets.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {

// Named barrier kId (1 to 15) of kThreads threads of a block, as __syncthreads_or.
template <int kId, int kThreads>
__device__ __forceinline__ bool NamedSyncOr(bool mine) {
  unsigned any;
  asm volatile(
      "{\n\t.reg .pred mine, any;\n\tsetp.ne.u32 mine, %1, 0;\n\t"
      "bar.red.or.pred any, %2, %3, mine;\n\tselp.u32 %0, 1, 0, any;\n\t}"
      : "=r"(any)
      : "r"(static_cast<unsigned>(mine)), "n"(kId), "n"(kThreads)
      : "memory");
  return any != 0;
}

// A barrier of kThreads threads (a block of kTileThreads, or a warp: every lane of it calls) that
// makes their shared-memory writes visible to each other; true when `mine` is true in any of them.
// With kTileThreads, `barrier` 0 is the block's own; 1 to kMostPairsPerBlock a named barrier that
// kTileThreads threads of a larger block meet at: a kWarpPerQueryHead block's pair
// (PairBarrier).
template <int kThreads>
__device__ __forceinline__ bool SyncOr(bool mine, int barrier = 0) {
  static_assert(kThreads == 32 || kThreads == kTileThreads, "a warp or a decode block");
  if constexpr (kThreads == 32) {
    __syncwarp();  // orders the warp's shared memory (a vote alone need not)
    return __any_sync(0xffffffffu, mine) != 0;
  } else {
    // Each id a constant: a barrier id in a register makes the kernel reserve all 16.
    switch (barrier) {
      case 0: return __syncthreads_or(mine) != 0;
      case 1: return NamedSyncOr<1, kThreads>(mine);
      case 2: return NamedSyncOr<2, kThreads>(mine);
      case 3: return NamedSyncOr<3, kThreads>(mine);
      default: return NamedSyncOr<4, kThreads>(mine);
    }
  }
}

// The named barrier of the `pair_in_block`th pair of a kWarpPerQueryHead block of several (its
// kTileThreads threads), for SyncOr: 1 to kMostPairsPerBlock (0, the block's, is the whole block's).
__device__ __forceinline__ int PairBarrier(int pair_in_block) { return 1 + pair_in_block; }

// Thread 0 of each block waits for the inputs (SpinOnFlag); the barrier then releases the block.
// With no ready flag, every thread waits for the end of a wait chained ahead (a launch with
// DecodeLink::chained_to_wait, whose inputs that wait put in place); launched plainly,
// WaitForPreviousKernel() returns at once.
__device__ inline void WaitForInputs(const DecodeLink& link) {
  if (link.ready == nullptr) {
    WaitForPreviousKernel();
  } else if (threadIdx.x == 0) {
    SpinOnFlag(link.ready, link.ready_value, link.timeout_ns, link.error, link.error_code);
  }
  __syncthreads();
}

// The block's inputs as lines (DecodeLink::lines): the query heads of its kv head, written to
// `q_to` (kG * kDim floats, shared memory), and, when `with_kv` (the block's split holds the new
// token), the new token's k and v for it, handed to `store_kv(is_k, d, value)` two dims (d and
// d + 1) at a time. Each thread polls its share of the lines at once (PollLines); the barrier makes
// the block's writes visible to its loads. True when any of the block's polls gave up or the step
// had failed already.
template <int kDim, int kG, typename StoreKv>
__device__ bool ReceiveInputLines(const DecodeLink& link, const float* q, int64_t q_stride, int seq, int kv_head,
                                  float* q_to, bool with_kv, const StoreKv& store_kv) {
  // Pairs of floats: the query heads', then k's, then v's.
  constexpr int kQPairs = kG * kDim / 2, kKvPairs = kDim / 2, kMostPairs = kQPairs + 2 * kKvPairs;
  constexpr int kPerThread = (kMostPairs + kTileThreads - 1) / kTileThreads;
  const int pairs = with_kv ? kMostPairs : kQPairs;
  const float* q_at = q + seq * q_stride + kv_head * kG * kDim;
  const float* k_at = link.k + seq * link.kv_stride + kv_head * kDim;
  const float* v_at = link.v + seq * link.kv_stride + kv_head * kDim;
  const Line* polled[kPerThread];
  int n = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int pair = threadIdx.x + i * kTileThreads;
    const float* at = pair < kQPairs              ? q_at + 2 * pair
                      : pair < kQPairs + kKvPairs ? k_at + 2 * (pair - kQPairs)
                                                  : v_at + 2 * (pair - kQPairs - kKvPairs);
    polled[i] = LineOf(link.lines, link.lines_mirror, pair < pairs ? at : q_at);
    if (pair < pairs) n = i + 1;
  }
  LinePoll poll = LinePoll::Begin(link.timeout_ns, link.error, link.error_code);
  float2 values[kPerThread];
  PollLines<kPerThread>(polled, n, link.line_tag, poll, values);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int pair = threadIdx.x + i * kTileThreads;
    if (i >= n) break;
    if (pair < kQPairs) {
      reinterpret_cast<float2*>(q_to)[pair] = values[i];
    } else {
      const bool is_k = pair < kQPairs + kKvPairs;
      store_kv(is_k, 2 * (is_k ? pair - kQPairs : pair - kQPairs - kKvPairs), values[i]);
    }
  }
  return __syncthreads_or(poll.failed) != 0;
}

// A (sequence, kv head)'s inputs as packets (DecodeLink::packets), polled by kThreads threads (a
// block of kTileThreads, or a warp) numbered `rank`: the query heads of its kv head into `q_to`
// (kG * kDim floats, shared memory) and, when `with_kv` (the caller holds the new token), the new
// token's k and v into `kv_to` (2 * kDim floats: k, then v). Eight lanes poll a packet, every warp
// its packets at once; a packet that two ranges share is polled for each. True when this thread's
// polls gave up or the step had failed already: the caller's barrier (SyncOr) makes the writes
// visible and shares that.
template <int kDim, int kG, int kThreads>
__device__ bool PollInputPackets(const DecodeLink& link, const float* q, int64_t q_stride, int seq, int kv_head,
                                 float* q_to, float* kv_to, bool with_kv, int rank) {
  constexpr int kQ = kG * kDim;
  constexpr int kFloats = static_cast<int>(kPacketFloats);
  // The most packets a range of n floats touches: n / 31 + 2.
  constexpr int kMost = kQ / kFloats + 2 + 2 * (kDim / kFloats + 2);
  constexpr int kAtOnce = kThreads / kPacketPieces;  // packets the threads load in one instruction
  constexpr int kRounds = (kMost + kAtOnce - 1) / kAtOnce;
  // Where the block's floats start in their row (packets_mirror's row `seq`).
  const int q_col = static_cast<int>(q - link.packets_mirror) + kv_head * kQ;
  const int k_col = static_cast<int>(link.k - link.packets_mirror) + kv_head * kDim;
  const int v_col = static_cast<int>(link.v - link.packets_mirror) + kv_head * kDim;
  const int q_first = q_col / kFloats, q_count = (q_col + kQ - 1) / kFloats - q_first + 1;
  const int k_first = k_col / kFloats, k_count = (k_col + kDim - 1) / kFloats - k_first + 1;
  const int v_first = v_col / kFloats, v_count = (v_col + kDim - 1) / kFloats - v_first + 1;
  const int count = q_count + (with_kv ? k_count + v_count : 0);
  const Packet* row = link.packets + seq * ((q_stride + kFloats - 1) / kFloats);  // PacketsPerRow(q_stride)
  const Packet* at[kRounds];
  int index[kRounds];
  uint32_t wanted = 0;
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    const int e = rank / kPacketPieces + i * kAtOnce;
    index[i] = e < q_count             ? q_first + e
               : e < q_count + k_count ? k_first + e - q_count
                                       : v_first + e - q_count - k_count;
    at[i] = row + (e < count ? index[i] : 0);
    if (e < count) wanted |= 1u << i;
  }
  LinePoll poll = LinePoll::Begin(link.timeout_ns, link.error, link.error_code);
  uint4 words[kRounds];
  PollPackets<kRounds>(at, wanted, link.line_tag, poll, words);
  const int piece = threadIdx.x % kPacketPieces;
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    if (!(wanted & (1u << i))) continue;
    const float v[4] = {__uint_as_float(words[i].x), __uint_as_float(words[i].y), __uint_as_float(words[i].z),
                        __uint_as_float(words[i].w)};
    const int col = index[i] * kFloats + piece * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = col + j;
      if (!HoldsFloat(piece, j)) continue;
      if (c >= q_col && c < q_col + kQ) q_to[c - q_col] = v[j];
      if (with_kv && c >= k_col && c < k_col + kDim) kv_to[c - k_col] = v[j];
      if (with_kv && c >= v_col && c < v_col + kDim) kv_to[kDim + c - v_col] = v[j];
    }
  }
  return poll.failed;
}

// The outputs of a (sequence, kv head), kG * kDim floats in `staged` (shared memory, written by
// the caller's threads before they call), as their part of the sequence's packet row
// (DecodeLink::out_packets), unless `failed`; sent by kThreads threads (a block of kTileThreads,
// or a warp) numbered `rank`, every one of which calls it, meeting first at `barrier` (SyncOr).
template <int kDim, int kG, int kThreads>
__device__ void SendOutputPackets(const DecodeLink& link, const float* staged, int seq, int kv_head, int num_kv_heads,
                                  bool failed, int rank, int barrier = 0) {
  constexpr int kQ = kG * kDim;
  constexpr int kFloats = static_cast<int>(kPacketFloats);
  constexpr int kPackets = (kQ + kFloats - 1) / kFloats;
  constexpr int kAtOnce = kThreads / kPacketPieces;
  SyncOr<kThreads>(false, barrier);
  if (failed) return;
  Packet* part = link.out_packets + (static_cast<int64_t>(seq) * num_kv_heads + kv_head) * kPackets;
  const int piece = rank % kPacketPieces;
  for (int p = rank / kPacketPieces; p < kPackets; p += kAtOnce) {
    const int col = p * kFloats + piece * 4;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = col + j < kQ && HoldsFloat(piece, j) ? staged[col + j] : 0.f;
    StorePacketPiece(part + p, piece,
                     make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                                piece == kPacketPieces - 1 ? link.line_tag : __float_as_uint(v[3])));
  }
}

// Output value `i` (even) and the next one of a row of `out`, where the launch writes them: as a
// line when out_lines is set, unless `failed` (a wait of the step gave up: the peer must not take
// the garbage for outputs, as the done flag that plain outputs wait on stays down then).
__device__ __forceinline__ void PutOutputPair(const DecodeLink* link, bool failed, float* out, int64_t i, float first,
                                              float second) {
  if (link != nullptr && link->out_lines != nullptr) {
    if (!failed) StoreLine(link->out_lines + i / 2, first, second, link->line_tag);
  } else {
    out[i] = first;
    out[i + 1] = second;
  }
}

// The last split's block merges the splits of (seq, kv_head): weights each split by
// 2^(lse - max lse). Warp w takes the query heads w, w + 4, ...; its lanes hold kPer consecutive
// dims each, and every split's weight comes from the lane that loaded its lse, so a head's row of
// each split is one load a warp, eight splits in flight. Loads bypass L1: other blocks of the
// launch wrote the partials. Outputs go where PutOutputPair puts them. The linked launch's merge;
// a plain launch's splits merge in MergeSplitsKernel, summed in the same order (the same bits).
// With `staged` (shared memory, kG * kDim floats) the outputs go there instead, for packets.
template <int kDim, int kG>
__device__ void MergeSplits(const float* partial_out, const float* partial_lse, int seq, int kv_head, int num_kv_heads,
                            int splits, const DecodeLink& link, bool failed, float* out, int64_t out_stride,
                            float* staged) {
  constexpr int kPer = kDim >= 64 ? kDim / 32 : 2;  // at least a pair, as output lines hold
  constexpr int kLanes = kDim / kPer;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int g = warp; g < kG; g += kTileWarps) {
    const int head = kv_head * kG + g;
    const int64_t row0 = (static_cast<int64_t>(seq) * num_kv_heads * kG + head) * splits;
    float m = -INFINITY;
    for (int s = lane; s < splits; s += 32) m = fmaxf(m, __ldcg(partial_lse + row0 + s));
    m = WarpMax(m);
    float sum = 0.f;
    float o[kPer] = {};
    for (int s0 = 0; s0 < splits; s0 += 32) {
      const int mine = s0 + lane;
      const float weight = m != -INFINITY && mine < splits ? exp2f(__ldcg(partial_lse + row0 + mine) - m) : 0.f;
      const int n = min(32, splits - s0);
      // Eight splits' loads in flight; one at a time for small heads, which spilled registers
      // (ptxas) in the kernels of head_dim 16 otherwise.
#pragma unroll(kDim >= 64 ? 8 : 1)
      for (int j = 0; j < n; ++j) {
        const float w = __shfl_sync(0xffffffffu, weight, j);
        sum += w;
        if (lane < kLanes) {
          const float* row = partial_out + (row0 + s0 + j) * kDim + lane * kPer;
          float v[kPer];
          if constexpr (kPer == 4) {
            const float4 x = __ldcg(reinterpret_cast<const float4*>(row));
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
          } else {
            const float2 x = __ldcg(reinterpret_cast<const float2*>(row));
            v[0] = x.x, v[1] = x.y;
          }
#pragma unroll
          for (int i = 0; i < kPer; ++i) o[i] = fmaf(w, v[i], o[i]);
        }
      }
    }
    if (lane < kLanes) {
      const float scale = OutputScale(sum);
#pragma unroll
      for (int i = 0; i < kPer; i += 2) {
        const float first = o[i] * scale, second = o[i + 1] * scale;
        if (staged != nullptr) {
          staged[g * kDim + lane * kPer + i] = first;
          staged[g * kDim + lane * kPer + i + 1] = second;
        } else {
          PutOutputPair(&link, failed, out, seq * out_stride + head * kDim + lane * kPer + i, first, second);
        }
      }
    }
  }
}

// Every thread of a linked launch's block, once its outputs are written: the last of `blocks`
// blocks raises the done flag and adds the launch's busy time. With no done flag (outputs as
// lines, which the peer polls), nothing fences: a system-scope fence here drains the block's
// output lines across the link before the launch may end and the next layer's may start, on the
// path of every hop of a few rows (a fifth of a small hop's time, lamina-bench-hop).
__device__ inline void ArriveAndFinish(const DecodeLink& link, uint32_t blocks) {
  if (link.done == nullptr && link.busy_ns == nullptr) return;
  if (ArriveAndRaise(link.counters, blocks, link.done, link.done_value, link.error) && link.busy_ns != nullptr) {
    // With a done flag, the first block's start is ordered before this through every block's
    // arrival; without one, the start may read as an earlier launch's, and the time counted
    // then runs from there to this end (less what was counted already).
    const unsigned long long end = GlobalTimerNs();
    const unsigned long long start = *const_cast<volatile uint64_t*>(link.busy_start);
    auto* words = reinterpret_cast<unsigned long long*>(link.busy_ns);
    const unsigned long long from = max(start, atomicMax(&words[1], end));
    if (end > from) atomicAdd(&words[0], end - from);
  }
}

// LoadQuery from the block's query heads as ReceiveInputLines left them in shared memory.
template <int kDim, int kG>
__device__ __forceinline__ void LoadPolledQuery(const float* polled, int lane, float q_scale, float (&qr)[kG][8]) {
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) qr[g][i] = polled[g * kDim + lane * 8 + i] * q_scale;
  }
}

// A linked launch's new token for (seq, kv_head): its k/v row stored at write_slots[seq], by
// `count` threads numbered `index`. The caller's barrier orders the stores before its loads.
template <int kDim>
__device__ __forceinline__ void StoreNewToken(const DecodeLink& link, const Bf16KvLayer& cache, int seq, int kv_head,
                                              int64_t slot_stride, int index, int count) {
  const int64_t from = seq * link.kv_stride + kv_head * kDim;
  const int64_t to = static_cast<int64_t>(link.write_slots[seq]) * slot_stride + kv_head * kDim;
  for (int d = index; d < kDim; d += count) {
    cache.k[to + d] = __float2bfloat16(__ldcg(link.k + from + d));
    cache.v[to + d] = __float2bfloat16(__ldcg(link.v + from + d));
  }
}

// The same from the new token's k and v as polled (`kv`: 2 * kDim floats in shared memory, k then
// v), at `slot` (where its kv head's row starts in the cache), two dims a thread at a time.
template <int kDim>
__device__ __forceinline__ void StorePolledToken(const Bf16KvLayer& cache, int64_t slot, const float* kv, int index,
                                                 int count) {
  for (int d = 2 * index; d < kDim; d += 2 * count) {
    *reinterpret_cast<__nv_bfloat162*>(cache.k + slot + d) = __floats2bfloat162_rn(kv[d], kv[d + 1]);
    *reinterpret_cast<__nv_bfloat162*>(cache.v + slot + d) = __floats2bfloat162_rn(kv[kDim + d], kv[kDim + d + 1]);
  }
}

// The same into a float8 cache, quantized (QuantizeHead) from k_value and v_value, dim
// threadIdx.x of the new token's k and v head. Every thread of the block calls it.
template <int kDim>
__device__ __forceinline__ void StoreNewTokenFloat8(const DecodeLink& link, const Float8KvLayer& cache, int seq,
                                                    int kv_head, int num_kv_heads, float k_value, float v_value) {
  const int64_t head = static_cast<int64_t>(link.write_slots[seq]) * num_kv_heads + kv_head;
  QuantizeHead(k_value, kDim, cache.k_codes + head * kDim, cache.k_scales + head);
  QuantizeHead(v_value, kDim, cache.v_codes + head * kDim, cache.v_scales + head);
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_DECODE_LINK_CUH_
