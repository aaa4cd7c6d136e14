// Decode attention over token slots. One block of 128 threads per (context split, kv head,
// sequence), in one of two ways (DecodePlan::tiled):
//  - tiled, as PlanDecode plans every launch: on the tensor cores (decode_tiles.cuh), streaming
//    the chunk's k and v rows through shared memory in tiles of 64 tokens with asynchronous copies,
//    each warp multiplying 16 tokens of a tile with the kv head's query heads;
//  - else (a plan that asks for it) on the CUDA cores: kLanes = head_dim / 8 threads share one
//    token, each holding 8 dims (one 16-byte load of K and one of V) and the query heads in
//    registers; the block's threads form kGroups such token groups, each taking kCoreUnroll tokens a
//    turn with all their loads issued before the first use.
// Either way the query is pre-scaled by 1/sqrt(d)·log2(e), so the softmax runs on exp2; each part
// of the block (warp or token group) keeps its own running max, sum and outputs; the block merges
// its parts through shared memory, and a second kernel merges the splits of a sequence.
// When contexts are short and the batch large (the plan's kWarpPerHead), a block of 128 threads
// serves four (sequence, kv head) pairs instead, one per warp: at one token a block's fixed costs
// (barriers, the shared-memory merge, the done flag's arrival) outweigh its attention, and one
// (sequence, kv head) per block leaves most of the GPU waiting on them. The warp's token groups
// merge through shuffles. A linked launch that polls its own packets at short contexts
// (kWarpPerQueryHead, PlanPolledDecode) takes 128 threads per (sequence, kv head) whose warps
// share out its query heads instead: they poll the pair's packets once and each warp attends to
// its own heads, so the launch's path from a pair's last packet to its outputs is a quarter as
// long. A block serves one such pair, or 2 or 4 (DecodePlan::pairs_per_block), each meeting at
// named barriers of its own: fewer blocks, for a spin budget that counts blocks.
// The linked variant (LinkedDecodeAttention) is the same kernel with its data-plane hop folded in:
// one thread per block waits for the inputs' flag, the split holding a sequence's new token stores
// its k/v first, the last split of a (sequence, kv head) to finish merges the splits itself, and
// the last block to write its outputs raises the done flag. One launch per layer, no host. For a
// hop of a few rows it may take its inputs and give its outputs as lines (line.h) instead: each
// block polls the lines of the floats it reads, and writes its outputs as lines, with no flag or
// fence in between, nor after them when no done flag is asked for.
// Over a float8 cache (float8_kv.cu) the kernel runs tiled, each lane widening the codes of its
// products' fragments to bf16 and folding in their scales (decode_tiles.cuh).
// The kernel, the merge of splits and their launches are in decode_kernel.cuh, shared with the
// float8 cache's entry points (float8_kv.cu).
#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/decode_cores.cuh"
#include "kernels/cuda/decode_kernel.cuh"
#include "kernels/cuda/decode_link.cuh"
#include "kernels/cuda/decode_tiles.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = kTileThreads;
// Short contexts (up to kShortMaxContext tokens, in one split) of at least kShortPairsPerSm
// (sequence, kv head) pairs per SM leave the tiles: a warp per pair from kWarpPairsPerSm pairs per
// SM on, or where the context is at most kWarpTokensPerPairPerSm tokens for each pair per SM; else
// a block per pair on the CUDA cores (see PlanDecode).
constexpr int64_t kShortMaxContext = 256;
constexpr int kShortPairsPerSm = 2;
constexpr int kWarpPairsPerSm = 8;
constexpr int kWarpTokensPerPairPerSm = 10;
// A launch that polls its own packets takes a warp per pair also from more pairs than half the SMs,
// where the context is at most kPolledWarpTokensPerPairPerSm tokens for each pair per SM
// (PlanPolledDecode).
constexpr int kPolledWarpTokensPerPairPerSm = 4;
// It takes a warp per query head instead up to kQueryHeadWarpPairsPerSm pairs an SM, where the
// context is at most kQueryHeadWarpMaxContext tokens or a warp per pair was its pick
// (PlanPolledDecode).
constexpr int kQueryHeadWarpPairsPerSm = 8;
constexpr int64_t kQueryHeadWarpMaxContext = 16;
constexpr int kWarpsPerBlock = kThreads / 32;
// The turns of each token group that a warp-per-query-head launch polling packets may load into
// registers before its polls (LoadEarlyTurns): contexts up to 16 tokens at head_dim 128 (2 groups
// of 4 tokens a turn). It does where its blocks fit in one wave of the kernel that does so
// (EarlyTurnsFit): their registers hold it to fewer blocks an SM (4 at head_dim 128 and 4 query
// heads a kv head, 108 registers a thread): within that wave the early turns shorten the round
// trip, past it they lengthen it. Copying the tokens into shared memory instead, or prefetching
// them into L1, gained half as much or less (the figures: this file's history).
constexpr int kEarlyTurns = 2;

// The query heads a warp of a warp-per-head launch attends to: all kG of its pair's, or, by query
// head (kWarpPerQueryHead), its share of them, dealt out evenly: one a warp up to kWarpsPerBlock
// heads (the warps past the last idle), else kG / kWarpsPerBlock (kQueryHeadsSplit).
constexpr bool QueryHeadsSplit(int64_t group) { return group <= kWarpsPerBlock || group % kWarpsPerBlock == 0; }
template <int kG>
constexpr bool kQueryHeadsSplit = QueryHeadsSplit(kG);
template <int kG, bool kByQueryHead>
constexpr int kWarpHeads = !kByQueryHead ? kG : kG <= kWarpsPerBlock ? 1 : kG / kWarpsPerBlock;

// A linked launch's dynamic shared memory a block where its inputs come as packets: for each warp
// (a warp per head) or for the block's pair (by query head), the pair's query heads, then the new
// token's k and v. The outputs, bound for packets, replace the query heads.
template <int kDim, int kG, bool kByQueryHead>
constexpr int kWarpPacketBlockFloats = (kByQueryHead ? 1 : kWarpsPerBlock) * (kG + 2) * kDim;

// kWarpPerHead: one warp per (sequence, kv head), kWarpsPerBlock of them a block, no splits. Warps
// past the last pair only join the block's barriers. Linked, with packets (DecodeLink::packets),
// each warp polls its own inputs and, with out_packets, sends its own outputs: a warp attends as
// soon as its rows are in while the rest travel.
// kByQueryHead (kWarpPerQueryHead): kThreads threads per (sequence, kv head), each warp attending
// to its share of the query heads (kWarpHeads); a block of kPairs such pairs
// (DecodePlan::pairs_per_block), each, where there are several, meeting at a named barrier of its
// own (PairBarrier: constant ids, so that the kernel reserves no more barriers than it uses, which
// would cost it blocks an SM). Linked with packets, each warp loads its first kEarly turns of cached
// tokens (0 or kEarlyTurns), the pair's threads then poll its packets once, its first warp stores
// the new token while every warp attends to it from the polled copy, and they send the pair's
// outputs.
template <int kDim, int kG, bool kLinked, bool kByQueryHead, int kEarly = 0, int kPairs = 1>
__global__ void __launch_bounds__(kThreads * kPairs)
    WarpDecodeKernel(const float* __restrict__ q, int64_t q_stride, Bf16KvLayer cache,
                     const int32_t* __restrict__ slot_ids, const int32_t* __restrict__ slot_begin,
                     float* __restrict__ out, int64_t out_stride, int num_kv_heads, int num_seqs, int sliding_window,
                     float q_scale, DecodeLink link) {
  static_assert(!kByQueryHead || kQueryHeadsSplit<kG>, "the warps share the query heads evenly");
  static_assert(kEarly == 0 || (kLinked && kByQueryHead), "early turns are a linked launch's by query head");
  static_assert(kPairs == 1 || (kByQueryHead && kPairs <= kMostPairsPerBlock), "pairs a block by query head");
  constexpr int kLanes = kDim / 8;
  constexpr int kH = kWarpHeads<kG, kByQueryHead>;
  // Linked with packets: kWarpPacketBlockFloats<kDim, kG, kByQueryHead> (by query head, for each
  // of the block's pairs).
  extern __shared__ __align__(16) float warp_packets[];
  // By query head: the block's pair the thread serves, and its place among that pair's threads.
  const int pair_in_block = kPairs > 1 ? threadIdx.x / kThreads : 0;
  const int rank = kPairs > 1 ? threadIdx.x % kThreads : threadIdx.x;
  const int barrier = kPairs > 1 ? PairBarrier(pair_in_block) : 0;  // the pair's (SyncOr)
  const int warp = rank / 32;
  const int pair = kByQueryHead ? blockIdx.x * kPairs + pair_in_block : blockIdx.x * kWarpsPerBlock + warp;
  const bool in_pairs = pair < num_seqs * num_kv_heads;
  const int first_head = kByQueryHead ? warp * kH : 0;  // the warp's first of the pair's query heads
  const bool active = in_pairs && first_head < kG;
  const int seq = in_pairs ? pair / num_kv_heads : 0;
  const int kv_head = pair % num_kv_heads;
  const int head = kv_head * kG + first_head;  // the warp's first query head in the row
  const int lane = threadIdx.x % kLanes;
  constexpr int kGroupsPerWarp = 32 / kLanes;
  const int group = threadIdx.x % 32 / kLanes;
  const int64_t slot_stride = static_cast<int64_t>(num_kv_heads) * kDim;
  if (!kLinked) StartChained();

  int begin = slot_begin[seq];
  const int end = slot_begin[seq + 1];
  if (sliding_window > 0 && end - begin > sliding_window) begin = end - sliding_window;

  const bool packets = kLinked && link.packets != nullptr;
  // The pair's query heads (then outputs), and the new token's k and v.
  float* staged = warp_packets + (kByQueryHead ? pair_in_block : warp) * (kG + 2) * kDim;
  float* kv = staged + kG * kDim;
  float* heads = staged + first_head * kDim;  // the warp's query heads (then outputs)
  // The warp that stores the new token.
  const bool stores = active && (!kByQueryHead || warp == 0);
  bool failed = false;  // a wait of the step gave up (packets only)
  // With packets, the first turns of the context's cached tokens, loaded while the packets travel.
  CoreTurn early[kEarly > 0 ? kEarly : 1];
  if (kLinked) {
    // No lines here: LinkedDecodeAttention refuses them with these plans.
    if (packets) {
      // Its slot is read before the polls, off the hop's path.
      const int64_t slot = link.write_slots[seq] * slot_stride + kv_head * kDim;
      if constexpr (kByQueryHead) {
        if constexpr (kEarly > 0) {
          if (active) {
            LoadEarlyTurns<kDim, kEarly>(cache.k, cache.v, slot_ids, slot_stride,
                                         static_cast<int64_t>(kv_head) * kDim + lane * 8, begin, end, group,
                                         kGroupsPerWarp, early);
          }
        }
        // The pair's threads poll once: each warp polling its own heads and the token doubles the
        // polls and slows the hop. Those of a pair past the last (in a block's last pairs) skip it
        // and the rest of the pair's work.
        if (kPairs == 1 || in_pairs) {
          failed = SyncOr<kThreads>(
              PollInputPackets<kDim, kG, kThreads>(link, q, q_stride, seq, kv_head, staged, kv, true, rank), barrier);
        }
      } else if (active) {
        failed = SyncOr<32>(PollInputPackets<kDim, kG, 32>(link, q, q_stride, seq, kv_head, staged, kv, true,
                                                           threadIdx.x % 32));
      }
      if (stores) StorePolledToken<kDim>(cache, slot, kv, threadIdx.x % 32, 32);
    } else {
      WaitForInputs(link);
      // Only output packets need it; the load stays in flight while the warp attends.
      failed = link.out_packets != nullptr && ErrorSet(link.error);
      if (stores) StoreNewToken<kDim>(link, cache, seq, kv_head, slot_stride, threadIdx.x % 32, 32);
      // By query head, the other warps read the token the first stored.
      if (kByQueryHead) __syncthreads();
    }
    if (link.busy_ns != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *link.busy_start = GlobalTimerNs();
    // The warp's own stores, ordered before its loads by __syncwarp.
    __syncwarp();
  }
  if (active) {
    float qr[kH][8];
    if (packets) {
      LoadPolledQuery<kDim, kH>(heads, lane, q_scale, qr);
    } else {
      LoadQuery<kDim, kH>(q, q_stride, seq, head, lane, q_scale, qr);
    }
    float acc[kH][8];
    float run_max[kH];
    float run_sum[kH];
    const int64_t head_offset = static_cast<int64_t>(kv_head) * kDim + lane * 8;  // the lane's dims in a slot
    if (kByQueryHead && packets) {
      // The new token as polled, not from the first warp's store, and the early turns.
      AttendTokens<kDim, kH, kEarly>(qr, cache.k, cache.v, slot_ids, slot_stride, head_offset, begin, end, group, 0,
                                     kGroupsPerWarp, acc, run_max, run_sum, kv + lane * 8, kv + kDim + lane * 8,
                                     early);
    } else {
      AttendTokens<kDim, kH>(qr, cache.k, cache.v, slot_ids, slot_stride, head_offset, begin, end, group, 0,
                             kGroupsPerWarp, acc, run_max, run_sum);
    }
    // Merge the warp's groups pairwise; every group ends with the whole result.
#pragma unroll
    for (int g = 0; g < kH; ++g) {
#pragma unroll
      for (int o = kLanes; o < 32; o <<= 1) {
        const float other_max = __shfl_xor_sync(0xffffffffu, run_max[g], o);
        const float other_sum = __shfl_xor_sync(0xffffffffu, run_sum[g], o);
        const float m = fmaxf(run_max[g], other_max);
        const float mine = m == -INFINITY ? 0.f : exp2f(run_max[g] - m);
        const float theirs = m == -INFINITY ? 0.f : exp2f(other_max - m);
        run_sum[g] = run_sum[g] * mine + other_sum * theirs;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * mine + __shfl_xor_sync(0xffffffffu, acc[g][i], o) * theirs;
        run_max[g] = m;
      }
    }
    // Each group writes its share of its lane's 8 dims, so that one store of the warp covers a
    // head's outputs contiguously (they may cross NVLink to a peer GPU); bound for packets, into
    // shared memory, over the warp's query heads (read by every lane by now).
    const bool out_packets = kLinked && link.out_packets != nullptr;
    constexpr int kShare = 8 / kGroupsPerWarp > 0 ? 8 / kGroupsPerWarp : 1;
    if (out_packets) __syncwarp();
    if (group * kShare < 8) {
#pragma unroll
      for (int g = 0; g < kH; ++g) {
        float share[kShare];
        const float scale = OutputScale(run_sum[g]);
#pragma unroll
        for (int j = 0; j < kShare; ++j) {
          share[j] = acc[g][j];
#pragma unroll
          for (int other = 1; other * kShare < 8; ++other) {
            if (group == other) share[j] = acc[g][other * kShare + j];
          }
          share[j] *= scale;
        }
        float* to = out_packets ? heads + g * kDim + lane * 8 + group * kShare
                                : out + seq * out_stride + (head + g) * kDim + lane * 8 + group * kShare;
        StoreShare<kShare>(to, share);
      }
    }
    if (out_packets && !kByQueryHead) {
      SendOutputPackets<kDim, kG, 32>(link, staged, seq, kv_head, num_kv_heads, failed, threadIdx.x % 32);
    }
  }
  if (kByQueryHead && kLinked && link.out_packets != nullptr && (kPairs == 1 || in_pairs)) {
    // Every warp's heads staged (the barrier), the pair's threads send its outputs, or nothing
    // where any warp's wait gave up.
    failed = SyncOr<kThreads>(failed, barrier);
    SendOutputPackets<kDim, kG, kThreads>(link, staged, seq, kv_head, num_kv_heads, failed, rank, barrier);
  }
  if (kLinked) ArriveAndFinish(link, gridDim.x);
}

// The dynamic shared memory of a block of a linked kWarpPerHead or kWarpPerQueryHead launch
// (kByQueryHead) serving kPairs pairs (by query head), with packets when `packets`.
template <int kDim, int kG, bool kByQueryHead, int kPairs>
size_t WarpBlockBytes(bool packets) {
  return packets ? size_t{kWarpPacketBlockFloats<kDim, kG, kByQueryHead>} * sizeof(float) * kPairs : 0;
}

// The resident blocks per SM of a linked WarpDecodeKernel<kDim, kG, true, kByQueryHead, kEarly,
// kPairs> launch with packets on the current device, asked once per device; 1 where no GPU
// answers.
template <int kDim, int kG, bool kByQueryHead, int kEarly = 0, int kPairs = 1>
int PolledWarpBlocksPerSm() {
  static std::mutex mutex;
  static std::map<int, int> known;
  int device = 0;
  int blocks = 0;
  if (cudaGetDevice(&device) == cudaSuccess) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(device);
    if (it != known.end()) return it->second;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &blocks, WarpDecodeKernel<kDim, kG, true, kByQueryHead, kEarly, kPairs>, kThreads * kPairs,
            WarpBlockBytes<kDim, kG, kByQueryHead, kPairs>(true)) == cudaSuccess &&
        blocks > 0) {
      known[device] = blocks;
      return blocks;
    }
  }
  cudaGetLastError();
  return 1;
}

// Whether a linked warp-per-query-head launch of `blocks` blocks of kPairs pairs polling packets
// fits in one wave of the kernel that loads early turns, on the current device (the wave's blocks
// asked once per device: this runs for every layer's launch).
template <int kDim, int kG, int kPairs>
bool EarlyTurnsFit(unsigned blocks) {
  static std::mutex mutex;
  static std::map<int, int64_t> wave_of;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = wave_of.find(device);
  if (it == wave_of.end()) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    it = wave_of.emplace(device, int64_t{sms} * PolledWarpBlocksPerSm<kDim, kG, true, kEarlyTurns, kPairs>()).first;
  }
  return int64_t{blocks} <= it->second;
}

// A kWarpPerHead launch (kByQueryHead: kWarpPerQueryHead, kPairs pairs a block) of `blocks`
// blocks, linked when `link` is set.
template <int kDim, int kG, bool kByQueryHead, int kPairs = 1>
absl::Status LaunchWarps(unsigned blocks, const float* q, int64_t q_stride, const Bf16KvLayer& cache,
                         const int32_t* slot_ids, const int32_t* slot_begin, float* out, int64_t out_stride,
                         int kv_heads, int seqs, int window, float q_scale, const DecodeLink* link,
                         cudaStream_t stream) {
  constexpr unsigned kBlockThreads = kThreads * kPairs;
  if (link != nullptr) {
    const size_t bytes =
        WarpBlockBytes<kDim, kG, kByQueryHead, kPairs>(link->packets != nullptr || link->out_packets != nullptr);
    // By query head with packets, the kernel that loads early turns where its blocks fit one wave.
    auto* kernel = WarpDecodeKernel<kDim, kG, true, kByQueryHead, 0, kPairs>;
    if constexpr (kByQueryHead) {
      if (link->packets != nullptr && EarlyTurnsFit<kDim, kG, kPairs>(blocks)) {
        kernel = WarpDecodeKernel<kDim, kG, true, true, kEarlyTurns, kPairs>;
      }
    }
    LAMINA_CUDA_RETURN_IF_ERROR(LaunchLinked(kernel, dim3(blocks), kBlockThreads, bytes, *link, stream, q, q_stride,
                                             cache, slot_ids, slot_begin, out, out_stride, kv_heads, seqs, window,
                                             q_scale, *link));
  } else {
    LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(WarpDecodeKernel<kDim, kG, false, kByQueryHead, 0, kPairs>,
                                              dim3(blocks), dim3(kBlockThreads), 0, stream, q, q_stride, cache,
                                              slot_ids, slot_begin, out, out_stride, kv_heads, seqs, window, q_scale,
                                              DecodeLink{}));
  }
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// Calls `f` with kPairs, std::integral_constant<int, ...>, for `pairs_per_block` (1, 2 or
// kMostPairsPerBlock; Dispatch refuses others).
template <typename F>
auto WithPairsPerBlock(int pairs_per_block, const F& f) {
  switch (pairs_per_block) {
    case 2: return f(std::integral_constant<int, 2>{});
    case kMostPairsPerBlock: return f(std::integral_constant<int, kMostPairsPerBlock>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

// `link` null: plain decode attention (the cache only read); else the linked variant.
template <int kDim, int kG>
absl::Status LaunchDecode(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                          const Bf16KvLayer& cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                          int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                          cudaStream_t stream) {
  if (!plan.by_warps()) {
    return LaunchBlockDecode<kDim, kG>(shape, plan, q, q_stride, cache, slot_ids, slot_begin, out, out_stride, num_seqs,
                                       workspace, link, stream);
  }
  const float q_scale = 1.4426950408889634f / sqrtf(static_cast<float>(kDim));
  const int kv_heads = static_cast<int>(shape.num_kv_heads);
  const int window = static_cast<int>(shape.sliding_window);
  const unsigned blocks = static_cast<unsigned>(DecodeBlocks(shape, plan, num_seqs));
  const int seqs = static_cast<int>(num_seqs);
  if (plan.strategy == DecodeStrategy::kWarpPerHead) {
    return LaunchWarps<kDim, kG, false>(blocks, q, q_stride, cache, slot_ids, slot_begin, out, out_stride, kv_heads,
                                        seqs, window, q_scale, link, stream);
  }
  if constexpr (kQueryHeadsSplit<kG>) {
    return WithPairsPerBlock(plan.pairs_per_block, [&](auto pairs) {
      return LaunchWarps<kDim, kG, true, decltype(pairs)::value>(blocks, q, q_stride, cache, slot_ids, slot_begin,
                                                                 out, out_stride, kv_heads, seqs, window, q_scale,
                                                                 link, stream);
    });
  } else {
    return absl::InvalidArgumentError(absl::StrCat("decode attention: a warp per query head serves 1 to 4 or 8 query "
                                                   "heads a kv head, not ",
                                                   kG));
  }
}

absl::Status Dispatch(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                      const Bf16KvLayer& cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                      int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                      cudaStream_t stream) {
  const int width = plan.pairs_per_block;
  if (width != 1 &&
      !(plan.strategy == DecodeStrategy::kWarpPerQueryHead && (width == 2 || width == kMostPairsPerBlock))) {
    return absl::InvalidArgumentError(absl::StrCat("decode attention: a plan of ", width,
                                                   " pairs a block (1, or 2 or 4 with a warp per query head)"));
  }
  return DispatchShape(shape, [&](auto dim, auto group) {
    return LaunchDecode<decltype(dim)::value, decltype(group)::value>(
        shape, plan, q, q_stride, cache, slot_ids, slot_begin, out, out_stride, num_seqs, workspace, link, stream);
  });
}

// The resident blocks per SM of the shallow tiled DecodeKernel<kDim, kG> on the current device, plain
// or linked, whichever holds fewer (the planner plans both alike), asked once per device;
// kTileBlocksPerSm where no GPU answers.
template <int kDim, int kG>
int TileBlocksPerSm() {
  static std::mutex mutex;
  static std::map<int, int> known;
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(device);
    if (it != known.end()) return it->second;
    const absl::StatusOr<int> bytes = PrepareTiledLaunch<kDim, kG, false, kShallowTileStages, Bf16KvLayer>();
    const absl::StatusOr<int> linked_bytes = PrepareTiledLaunch<kDim, kG, true, kShallowTileStages, Bf16KvLayer>();
    int blocks = 0, linked_blocks = 0;
    if (bytes.ok() && linked_bytes.ok() &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &blocks, DecodeKernel<kDim, kG, false, kShallowTileStages, Bf16KvLayer>, kThreads, *bytes) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&linked_blocks,
                                                      DecodeKernel<kDim, kG, true, kShallowTileStages, Bf16KvLayer>,
                                                      kThreads, *linked_bytes) == cudaSuccess &&
        std::min(blocks, linked_blocks) > 0) {
      known[device] = std::min(blocks, linked_blocks);
      return known[device];
    }
  }
  cudaGetLastError();
  return kTileBlocksPerSm;
}

// Whether a block of the deep tiled DecodeKernel<kDim> may have its shared memory on the current
// device (it takes more than some GPUs allow a block): its tiles, and the most static shared memory
// a variant declares (a linked one's 8 polled query heads). True where no GPU answers.
template <int kDim>
bool DeepTilesFit() {
  constexpr int kMostStaticBytes = 8 * kDim * static_cast<int>(sizeof(float));
  int device = 0, per_block = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return true;  // no GPU to ask: plan as for the GPUs we build for
  }
  const bool fits =
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      per_block >= TileLayout<kDim, kDeepTileStages>::kBytes + kMostStaticBytes;
  cudaGetLastError();
  return fits;
}

// DeepTilesFit for a head_dim; true for those DecodeAttention refuses (it refuses them anyway).
bool DeepTilesFitFor(int64_t head_dim) {
  switch (head_dim) {
    case 16:
      return DeepTilesFit<16>();
    case 32:
      return DeepTilesFit<32>();
    case 64:
      return DeepTilesFit<64>();
    case 128:
      return DeepTilesFit<128>();
    default:
      return true;
  }
}

template <int kDim>
int GroupBlocksPerSm(int64_t group) {
  switch (group) {
    case 1: return TileBlocksPerSm<kDim, 1>();
    case 2: return TileBlocksPerSm<kDim, 2>();
    case 3: return TileBlocksPerSm<kDim, 3>();
    case 4: return TileBlocksPerSm<kDim, 4>();
    case 5: return TileBlocksPerSm<kDim, 5>();
    case 6: return TileBlocksPerSm<kDim, 6>();
    case 7: return TileBlocksPerSm<kDim, 7>();
    case 8: return TileBlocksPerSm<kDim, 8>();
    default: return 1;  // DecodeAttention refuses the shape
  }
}

}  // namespace

int DecodeBlocksPerSm(const AttentionShape& shape) {
  const int64_t group = shape.num_kv_heads > 0 ? shape.num_q_heads / shape.num_kv_heads : 0;
  switch (shape.head_dim) {
    case 16: return GroupBlocksPerSm<16>(group);
    case 32: return GroupBlocksPerSm<32>(group);
    case 64: return GroupBlocksPerSm<64>(group);
    case 128: return GroupBlocksPerSm<128>(group);
    default: return 1;
  }
}

const char* DecodeStrategyName(DecodeStrategy strategy) {
  switch (strategy) {
    case DecodeStrategy::kBlockPerHead: return "block per head";
    case DecodeStrategy::kWarpPerHead: return "warp per head";
    case DecodeStrategy::kTiled: return "tiled";
    case DecodeStrategy::kDeepTiled: return "deep tiles";
    case DecodeStrategy::kWarpPerQueryHead: return "warp per query head";
  }
  return "?";
}

DecodePlan PlanDecode(const AttentionShape& shape, int64_t num_seqs, int64_t max_context, int num_sms,
                      int blocks_per_sm, bool deep_tiles_fit) {
  // Tiled, but for short contexts at large batches (below): in Llama-3-8B decode steps the tiled
  // kernel beats the CUDA-core one from batch 1 (8 pairs) on, once deep tiles no longer ask for
  // an SM's whole shared memory (tests/bench/RESULTS.md, decode attention kernels).
  DecodePlan plan;
  const int64_t pairs = std::max<int64_t>(1, num_seqs * shape.num_kv_heads);
  const int64_t context = std::max<int64_t>(1, max_context);
  // At most a pair an SM: the deep pipeline, a block an SM.
  const bool deep = deep_tiles_fit && pairs <= num_sms;
  plan.strategy = deep ? DecodeStrategy::kDeepTiled : DecodeStrategy::kTiled;
  // A launch takes as many turns of tiles as its longest block, once per wave of blocks, plus a
  // block's fixed costs (about a tile), plus the merge of the splits (about another). At most a
  // tile a split; past two waves of blocks more splits only add waves.
  const int64_t resident = std::max<int64_t>(1, static_cast<int64_t>(num_sms) * (deep ? 1 : blocks_per_sm));
  const int64_t most =
      std::min<int64_t>({(context + kTileTokens - 1) / kTileTokens, kMaxMergedSplits, 2 * resident / pairs + 1});
  int64_t best_cost = INT64_MAX;
  for (int64_t splits = 1; splits <= std::max<int64_t>(1, most); ++splits) {
    const int64_t tiles = ((context + splits - 1) / splits + kTileTokens - 1) / kTileTokens;
    const int64_t waves = (pairs * splits + resident - 1) / resident;
    const int64_t cost = waves * (tiles + 1) + (splits > 1 ? 1 : 0);
    if (cost < best_cost) {
      best_cost = cost;
      plan.splits = static_cast<int>(splits);
    }
  }
  if (plan.splits > 1) plan.workspace_floats = num_seqs * shape.num_q_heads * plan.splits * (shape.head_dim + 1);
  // Short contexts leave the tiles from 2 pairs an SM. A warp each pays once a block each needs
  // more than a full load of blocks, and below that where the context is short for the pairs: each
  // warp reads its whole context, while a block each pays for its waves. Where no warp each is
  // taken, a block each on the CUDA cores beats the tiles (the thresholds' measurements:
  // `lamina-bench-kernels --only short`, and this file's history).
  if (plan.splits == 1 && max_context <= kShortMaxContext && pairs >= kShortPairsPerSm * num_sms) {
    const bool warps = pairs >= kWarpPairsPerSm * num_sms || max_context * num_sms <= kWarpTokensPerPairPerSm * pairs;
    plan.strategy = warps ? DecodeStrategy::kWarpPerHead : DecodeStrategy::kBlockPerHead;
  }
  return plan;
}

DecodePlan PlanDecode(const AttentionShape& shape, int64_t num_seqs, int64_t max_context, int num_sms) {
  return PlanDecode(shape, num_seqs, max_context, num_sms, DecodeBlocksPerSm(shape), DeepTilesFitFor(shape.head_dim));
}

DecodePlan PlanPolledDecode(const AttentionShape& shape, const DecodePlan& plan, int64_t num_seqs,
                            int64_t max_context, int num_sms) {
  // Where its rows are polled, a warp each beats PlanDecode's tiled blocks from more pairs than
  // half the SMs at the shortest contexts (measured with lamina-bench-data-plane; this file's
  // history has the figures).
  const int64_t pairs = num_seqs * shape.num_kv_heads;
  const int64_t context = std::max<int64_t>(1, max_context);
  DecodePlan polled = plan;
  if (plan.strategy != DecodeStrategy::kWarpPerHead && plan.splits == 1 && context <= kShortMaxContext &&
      2 * pairs > num_sms && context * num_sms <= kPolledWarpTokensPerPairPerSm * pairs) {
    polled = DecodePlan{};
    polled.strategy = DecodeStrategy::kWarpPerHead;
  }
  // A warp per query head runs a quarter of a warp per head's instructions between its polls and
  // its sends: the shortest round trip at short contexts, up to a few warps' worth of pairs an SM.
  if (QueryHeadWarpsServe(shape) && polled.splits == 1 && pairs <= int64_t{kQueryHeadWarpPairsPerSm} * num_sms &&
      (context <= kQueryHeadWarpMaxContext || polled.strategy == DecodeStrategy::kWarpPerHead)) {
    DecodePlan query_heads;
    query_heads.strategy = DecodeStrategy::kWarpPerQueryHead;
    return query_heads;
  }
  return polled;
}

DecodePlan Float8Plan(const DecodePlan& plan) {
  DecodePlan tiled = plan;
  if (!plan.tiled()) {
    tiled.strategy = DecodeStrategy::kTiled;
    tiled.pairs_per_block = 1;
  }
  return tiled;
}

int64_t DecodeBlocks(const AttentionShape& shape, const DecodePlan& plan, int64_t num_seqs) {
  const int64_t pairs = num_seqs * shape.num_kv_heads;
  switch (plan.strategy) {
    case DecodeStrategy::kWarpPerQueryHead:
      return (pairs + plan.pairs_per_block - 1) / plan.pairs_per_block;
    case DecodeStrategy::kWarpPerHead:
      return (pairs + kWarpsPerBlock - 1) / kWarpsPerBlock;
    default:
      return pairs * plan.splits;
  }
}

int PolledBlocksPerSm(const AttentionShape& shape, const DecodePlan& plan) {
  if (!plan.by_warps()) return 1;
  int blocks = 1;
  // DispatchShape refuses the shapes DecodeAttention does: they keep 1.
  DispatchShape(shape, [&](auto dim, auto group) {
    constexpr int kDim = decltype(dim)::value, kG = decltype(group)::value;
    if (plan.strategy == DecodeStrategy::kWarpPerHead) {
      blocks = PolledWarpBlocksPerSm<kDim, kG, false>();
    } else if constexpr (kQueryHeadsSplit<kG>) {
      blocks = WithPairsPerBlock(plan.pairs_per_block, [](auto pairs) {
        return PolledWarpBlocksPerSm<kDim, kG, true, 0, decltype(pairs)::value>();
      });
    }
    return absl::OkStatus();
  }).IgnoreError();
  return blocks;
}

bool QueryHeadWarpsServe(const AttentionShape& shape) {
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) return false;
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  // DispatchShape's groups (1 to 8) that the warps share evenly.
  return group >= 1 && group <= 8 && QueryHeadsSplit(group);
}

absl::Status DecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                             const bf16* k_cache, const bf16* v_cache, const int32_t* slot_ids,
                             const int32_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                             float* workspace, cudaStream_t stream) {
  if (num_seqs == 0) return absl::OkStatus();
  if (plan.splits > kMaxMergedSplits) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode attention: plan of ", plan.splits, " splits (at most ", kMaxMergedSplits, ")"));
  }
  // Unlinked, the kernel only reads the cache.
  return Dispatch(shape, plan, q, q_stride, Bf16KvLayer{const_cast<bf16*>(k_cache), const_cast<bf16*>(v_cache)},
                  slot_ids, slot_begin, out, out_stride, num_seqs, workspace, nullptr, stream);
}

int64_t LinkedDecodeCounters(const AttentionShape& shape, int64_t num_seqs) { return 1 + num_seqs * shape.num_kv_heads; }

absl::Status CheckDecodeLink(const DecodePlan& plan, int64_t num_seqs, const float* q, int64_t q_stride,
                             int64_t out_stride, const DecodeLink& link) {
  if (num_seqs <= 0) {
    return absl::InvalidArgumentError("linked decode attention: no sequences (nothing would raise the done flag)");
  }
  if (link.k == nullptr || link.v == nullptr || link.write_slots == nullptr || link.error == nullptr ||
      link.counters == nullptr || (link.busy_ns != nullptr && link.busy_start == nullptr)) {
    return absl::InvalidArgumentError(
        "linked decode attention: k, v, write_slots, error and counters are required, and busy_start with busy_ns");
  }
  if ((link.lines != nullptr || link.out_lines != nullptr) && plan.by_warps()) {
    return absl::InvalidArgumentError("linked decode attention: lines with a warp-per-head or per-query-head plan");
  }
  if (link.lines != nullptr && (link.lines_mirror == nullptr || link.ready != nullptr || q_stride % 2 != 0 ||
                                link.kv_stride % 2 != 0 || (q - link.lines_mirror) % 2 != 0 ||
                                (link.k - link.lines_mirror) % 2 != 0 || (link.v - link.lines_mirror) % 2 != 0)) {
    return absl::InvalidArgumentError(
        "linked decode attention: input lines need lines_mirror, no ready flag, and q, k and v at even floats");
  }
  if (link.out_lines != nullptr && out_stride % 2 != 0) {
    return absl::InvalidArgumentError("linked decode attention: output lines need an even out_stride");
  }
  const bool lines = link.lines != nullptr || link.out_lines != nullptr;
  const bool packets = link.packets != nullptr || link.out_packets != nullptr;
  if (packets && lines) {
    return absl::InvalidArgumentError("linked decode attention: packets with lines");
  }
  // q, k and v of the first row lie in the first mirrored row.
  auto in_row = [&](const float* p) { return p >= link.packets_mirror && p < link.packets_mirror + q_stride; };
  if (link.packets != nullptr && (link.packets_mirror == nullptr || link.ready != nullptr ||
                                  link.kv_stride != q_stride || !in_row(q) || !in_row(link.k) || !in_row(link.v))) {
    return absl::InvalidArgumentError(
        "linked decode attention: input packets need packets_mirror, no ready flag, kv_stride equal to q_stride, "
        "and q, k and v within the mirrored rows");
  }
  return absl::OkStatus();
}

absl::Status LinkedDecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q,
                                   int64_t q_stride, bf16* k_cache, bf16* v_cache, const int32_t* slot_ids,
                                   const int32_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                                   float* workspace, const DecodeLink& link, cudaStream_t stream) {
  LAMINA_RETURN_IF_ERROR(CheckDecodeLink(plan, num_seqs, q, q_stride, out_stride, link));
  return Dispatch(shape, plan, q, q_stride, Bf16KvLayer{k_cache, v_cache}, slot_ids, slot_begin, out, out_stride,
                  num_seqs, workspace, &link, stream);
}

}  // namespace lamina::kernels::cuda
