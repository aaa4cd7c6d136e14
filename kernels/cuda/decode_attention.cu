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
// When contexts are short and the batch large (the plan's warp_per_head), a block of 128 threads
// serves four (sequence, kv head) pairs instead, one per warp: at one token a block's fixed costs
// (barriers, the shared-memory merge, the done flag's arrival) outweigh its attention, and one
// (sequence, kv head) per block leaves most of the GPU waiting on them. The warp's token groups
// merge through shuffles.
// The linked variant (LinkedDecodeAttention) is the same kernel with its data-plane hop folded in:
// one thread per block waits for the inputs' flag, the split holding a sequence's new token stores
// its k/v first, the last split of a (sequence, kv head) to finish merges the splits itself, and
// the last block to write its outputs raises the done flag. One launch per layer, no host. For a
// hop of a few rows it may take its inputs and give its outputs as lines (line.h) instead: each
// block polls the lines of the floats it reads, and writes its outputs as lines, with no flag or
// fence in between, nor after them when no done flag is asked for.
#include <algorithm>
#include <cfloat>
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
#include "kernels/cuda/decode_link.cuh"
#include "kernels/cuda/decode_tiles.cuh"
#include "kernels/cuda/flags.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = kTileThreads;
// A warp per (sequence, kv head) takes over from a block each from this many pairs per SM on.
constexpr int kWarpPairsPerSm = 8;
constexpr int kWarpsPerBlock = kThreads / 32;
// Batches of contexts up to this many tokens that fill the GPU with blocks in one split run one
// warp per (sequence, kv head) instead.
constexpr int64_t kWarpMaxContext = 256;

// k_cache and v_cache are written only when kLinked (the new tokens' k/v). kStages > 0: the block
// attends on the tensor cores (decode_tiles.cuh), kStages tiles in dynamic shared memory; 0: its
// 128 threads form kGroups token groups of kLanes lanes (AttendTokens).
template <int kDim, int kG, bool kLinked, int kStages>
__global__ void __launch_bounds__(kThreads) DecodeKernel(
    const float* __restrict__ q, int64_t q_stride, bf16* k_cache, bf16* v_cache,
    const int32_t* __restrict__ slot_ids, const int32_t* __restrict__ slot_begin, float* __restrict__ out,
    int64_t out_stride, int num_kv_heads, int sliding_window, float q_scale, float* __restrict__ partial_out,
    float* __restrict__ partial_lse, DecodeLink link) {
  constexpr bool kTiled = kStages > 0;
  extern __shared__ __align__(16) unsigned char tile_smem[];  // tiled: TileLayout<kDim, kStages>::kBytes at least
  const int split = blockIdx.x;
  const int splits = gridDim.x;
  const int kv_head = blockIdx.y;
  const int seq = blockIdx.z;
  // The linked variant is launched ahead of its inputs, not chained. Chained, the tiled one reads
  // the slot tables and queues its first tiles before the kernel ahead of it has ended
  // (DecodeAttention's contract allows it).
  if (!kLinked) {
    LetNextKernelStart();
    if (!kTiled) WaitForPreviousKernel();
  }

  int begin = slot_begin[seq];
  const int end = slot_begin[seq + 1];
  if (sliding_window > 0 && end - begin > sliding_window) begin = end - sliding_window;
  // Tiled, split contexts in whole tiles, so that only a split's last tile may be part-filled.
  int chunk = (end - begin + splits - 1) / splits;
  if (kTiled && splits > 1) chunk = (chunk + kTileTokens - 1) / kTileTokens * kTileTokens;
  const int lo = min(end, begin + split * chunk);
  const int hi = min(end, lo + chunk);
  const int64_t slot_stride = static_cast<int64_t>(num_kv_heads) * kDim;

  // Tiled, the first tiles go in flight before the wait for the inputs (the kernel ahead, or the
  // linked hop), unless they hold the context's last token: the step's new one, which StoreKv or
  // the linked launch itself writes.
  using Tiles = TileStream<kDim, kTiled ? kStages : kShallowTileStages>;
  const Tiles tiles{k_cache, v_cache, slot_ids, slot_stride, static_cast<int64_t>(kv_head) * kDim, lo, hi, tile_smem};
  const bool tiles_started = kTiled && lo + Tiles::kTilesAhead * kTileTokens < end;
  if constexpr (kTiled) {
    if (tiles_started) tiles.StartTiles();
    if (!kLinked) WaitForPreviousKernel();
  }

  // Whether a wait of the step gave up, as this block knows it before attending.
  bool failed = false;
  __shared__ __align__(16) float q_polled[kLinked ? kG * kDim : 1];  // the query heads, from lines
  if (kLinked) {
    // The new token is the context's last; the split attending to it stores it first.
    const bool holds_new_token = end - 1 >= lo && end - 1 < hi;
    if (link.lines != nullptr) {
      // Its slot is read before the polls, off the hop's path.
      const int64_t slot = holds_new_token ? link.write_slots[seq] * slot_stride + kv_head * kDim : 0;
      failed = ReceiveInputLines<kDim, kG>(link, q, q_stride, seq, kv_head, q_polled,
                                           holds_new_token ? k_cache + slot : nullptr, v_cache + slot);
    } else {
      WaitForInputs(link);
      // Only output lines need it; the load stays in flight while the block attends.
      failed = link.out_lines != nullptr && ErrorSet(link.error);
      // The barrier makes the block's own stores visible to its loads below.
      if (holds_new_token) {
        StoreNewToken<kDim>(link, k_cache, v_cache, seq, kv_head, slot_stride, threadIdx.x, kThreads);
      }
      __syncthreads();
    }
    const bool first_block = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    if (link.busy_ns != nullptr && first_block && threadIdx.x == 0) *link.busy_start = GlobalTimerNs();
  }

  // The block's parts (warps when tiled, token groups else) leave their maxima and sums, [part][g],
  // and outputs, [part][g][dim], in shared memory.
  constexpr int kParts = kTiled ? kTileWarps : kThreads / (kDim / 8);
  __shared__ float group_state[kTiled ? 1 : kParts * kG * (kDim + 2)];
  float* shared_max = kTiled ? reinterpret_cast<float*>(tile_smem) : group_state;
  float* shared_sum = shared_max + kParts * kG;
  float* shared_acc = shared_sum + kParts * kG;
  if constexpr (kTiled) {
    // The kv head's query heads as the A fragments of the products.
    auto make_query = [&](uint32_t (&high)[kDim / 16][2], uint32_t (&low)[kDim / 16][2]) {
      if (kLinked && link.lines != nullptr) {
        QueryFragments<kDim, kG>([&](int i) { return q_polled[i]; }, q_scale, high, low);
      } else {
        // Through L2: with a link the rows were just written by a peer GPU.
        const float* q_heads = q + seq * q_stride + kv_head * kG * kDim;
        QueryFragments<kDim, kG>([&](int i) { return __ldcg(q_heads + i); }, q_scale, high, low);
      }
    };
    if (!tiles_started) tiles.StartTiles();
    WarpRows<kDim> rows;
    tiles.AttendTiles(make_query, rows);
    // The tiles' shared memory is free again.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane / 4 < kG && lane % 4 == 0) {
      shared_max[warp * kG + lane / 4] = rows.max;
      shared_sum[warp * kG + lane / 4] = rows.sum;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = 2 * (lane % 4) + h;
      if (head >= kG) continue;
      float* to = shared_acc + (warp * kG + head) * kDim + lane / 4;
#pragma unroll
      for (int d = 0; d < kDim / 16; ++d) {
        to[16 * d] = rows.o[d][h];
        to[16 * d + 8] = rows.o[d][2 + h];
      }
    }
  } else {
    constexpr int kLanes = kDim / 8;
    const int lane = threadIdx.x % kLanes;
    const int group = threadIdx.x / kLanes;
    float qr[kG][8];
    if (kLinked && link.lines != nullptr) {
      LoadPolledQuery<kDim, kG>(q_polled, lane, q_scale, qr);
    } else {
      LoadQuery<kDim, kG>(q, q_stride, seq, kv_head, lane, q_scale, qr);
    }
    float acc[kG][8];
    float run_max[kG];
    float run_sum[kG];
    constexpr int kGroupsPerWarp = 32 / kLanes;
    AttendTokens<kDim, kG>(qr, k_cache, v_cache, slot_ids, slot_stride,
                           static_cast<int64_t>(kv_head) * kDim + lane * 8, lo, hi, group,
                           group / kGroupsPerWarp * kGroupsPerWarp, kParts, acc, run_max, run_sum);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (lane == 0) {
        shared_max[group * kG + g] = run_max[g];
        shared_sum[group * kG + g] = run_sum[g];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) shared_acc[(group * kG + g) * kDim + lane * 8 + i] = acc[g][i];
    }
  }
  __syncthreads();
  // Each thread takes two neighbouring dims of a head, so that an output line holds both.
  for (int idx = 2 * threadIdx.x; idx < kG * kDim; idx += 2 * kThreads) {
    const int g = idx / kDim;
    const int d = idx % kDim;
    float m = -INFINITY;
    for (int w = 0; w < kParts; ++w) m = fmaxf(m, shared_max[w * kG + g]);
    float sum = 0.f;
    float o[2] = {0.f, 0.f};
    if (m != -INFINITY) {
      for (int w = 0; w < kParts; ++w) {
        const float weight = exp2f(shared_max[w * kG + g] - m);
        sum += shared_sum[w * kG + g] * weight;
        o[0] += shared_acc[(w * kG + g) * kDim + d] * weight;
        o[1] += shared_acc[(w * kG + g) * kDim + d + 1] * weight;
      }
    }
    const int head = kv_head * kG + g;
    const float first = sum > 0.f ? o[0] / sum : 0.f, second = sum > 0.f ? o[1] / sum : 0.f;
    if (splits == 1) {
      PutOutputPair(kLinked ? &link : nullptr, failed, out, seq * out_stride + head * kDim + d, first, second);
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * num_kv_heads * kG + head) * splits + split;
      partial_out[row * kDim + d] = first;
      partial_out[row * kDim + d + 1] = second;
      if (d == 0) partial_lse[row] = sum > 0.f ? m + log2f(sum) : -INFINITY;
    }
  }
  if (!kLinked) return;

  const uint32_t writers = static_cast<uint32_t>(gridDim.y) * gridDim.z;  // one per (sequence, kv head)
  if (splits > 1) {
    // The last split of this (sequence, kv head) to finish merges them all.
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();  // for the whole block's partials, after the barrier (fences are cumulative)
      uint32_t* counter = &link.counters[1 + seq * num_kv_heads + kv_head];
      last = atomicAdd(counter, 1u) + 1 == static_cast<uint32_t>(splits);
      if (last) *counter = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Another split's wait may have given up: its arrival came after it set the error word.
    if (link.out_lines != nullptr) failed = failed || ErrorSet(link.error);
    MergeSplits<kDim, kG>(partial_out, partial_lse, seq, kv_head, num_kv_heads, splits, link, failed, out, out_stride);
  }
  ArriveAndFinish(link, writers);
}

// warp_per_head: one warp per (sequence, kv head), kWarpsPerBlock of them a block, no splits. Warps past
// the last pair only join the block's barriers.
template <int kDim, int kG, bool kLinked>
__global__ void __launch_bounds__(kThreads) WarpDecodeKernel(
    const float* __restrict__ q, int64_t q_stride, bf16* k_cache, bf16* v_cache,
    const int32_t* __restrict__ slot_ids, const int32_t* __restrict__ slot_begin, float* __restrict__ out,
    int64_t out_stride, int num_kv_heads, int num_seqs, int sliding_window, float q_scale, DecodeLink link) {
  constexpr int kLanes = kDim / 8;
  const int pair = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const bool active = pair < num_seqs * num_kv_heads;
  const int seq = active ? pair / num_kv_heads : 0;
  const int kv_head = pair % num_kv_heads;
  const int lane = threadIdx.x % kLanes;
  constexpr int kGroupsPerWarp = 32 / kLanes;
  const int group = threadIdx.x % 32 / kLanes;
  const int64_t slot_stride = static_cast<int64_t>(num_kv_heads) * kDim;
  if (!kLinked) StartChained();

  int begin = slot_begin[seq];
  const int end = slot_begin[seq + 1];
  if (sliding_window > 0 && end - begin > sliding_window) begin = end - sliding_window;

  if (kLinked) {
    // No lines here: LinkedDecodeAttention refuses them with a warp-per-head plan.
    WaitForInputs(link);
    if (link.busy_ns != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *link.busy_start = GlobalTimerNs();
    // The warp's own stores, ordered before its loads by __syncwarp.
    if (active) StoreNewToken<kDim>(link, k_cache, v_cache, seq, kv_head, slot_stride, threadIdx.x % 32, 32);
    __syncwarp();
  }
  if (active) {
    float qr[kG][8];
    LoadQuery<kDim, kG>(q, q_stride, seq, kv_head, lane, q_scale, qr);
    float acc[kG][8];
    float run_max[kG];
    float run_sum[kG];
    AttendTokens<kDim, kG>(qr, k_cache, v_cache, slot_ids, slot_stride, static_cast<int64_t>(kv_head) * kDim + lane * 8,
                           begin, end, group, 0, kGroupsPerWarp, acc, run_max, run_sum);
    // Merge the warp's groups pairwise; every group ends with the whole result.
#pragma unroll
    for (int g = 0; g < kG; ++g) {
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
    // head's outputs contiguously (they may cross NVLink to a peer GPU).
    constexpr int kShare = 8 / kGroupsPerWarp > 0 ? 8 / kGroupsPerWarp : 1;
    if (group * kShare < 8) {
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float share[kShare];
#pragma unroll
        for (int j = 0; j < kShare; ++j) {
          share[j] = acc[g][j];
#pragma unroll
          for (int other = 1; other * kShare < 8; ++other) {
            if (group == other) share[j] = acc[g][other * kShare + j];
          }
          share[j] = run_sum[g] > 0.f ? share[j] / run_sum[g] : 0.f;
        }
        StoreShare<kShare>(out + seq * out_stride + (kv_head * kG + g) * kDim + lane * 8 + group * kShare, share);
      }
    }
  }
  if (kLinked) ArriveAndFinish(link, gridDim.x);
}

// One block per (sequence, head): weights each split by 2^(lse - max lse). The block loads the
// splits' lse once, into shared memory, and each thread then reads its dimension of every split
// eight at a time.
constexpr int kMaxMergedSplits = 1024;
template <int kDim>
__global__ void MergeSplitsKernel(const float* __restrict__ partial_out, const float* __restrict__ partial_lse,
                                  float* __restrict__ out, int64_t out_stride, int num_heads, int splits) {
  StartChained();
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int64_t row0 = (static_cast<int64_t>(seq) * num_heads + head) * splits;
  __shared__ float weight[kMaxMergedSplits];
  float m = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    weight[s] = partial_lse[row0 + s];
    m = fmaxf(m, weight[s]);
  }
  m = BlockMax(m);
  for (int s = threadIdx.x; s < splits; s += blockDim.x) weight[s] = m == -INFINITY ? 0.f : exp2f(weight[s] - m);
  __syncthreads();
  // Summed in split order, as MergedOutput does, so that the linked launch gives the same bits.
  for (int d = threadIdx.x; d < kDim; d += blockDim.x) {
    float sum = 0.f;
    float o = 0.f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      sum += weight[s];
      o += weight[s] * partial_out[(row0 + s) * kDim + d];
    }
    out[seq * out_stride + head * kDim + d] = sum > 0.f ? o / sum : 0.f;
  }
}

// Two blocks of DecodeKernel an SM stream the cache fastest: on an H100 a third one (the registers
// allow three) made every large batch slower, 0.95 rather than 0.98 of the read rate for MHA at
// batch 128 (tests/bench/RESULTS.md). A launch asks for enough shared memory to keep it at two.
constexpr int kTileBlocksPerSm = 2;

// The dynamic shared memory of a tiled DecodeKernel<kDim, kG, kLinked, kStages> launch on the
// current device. Shallow: its tiles' (TileLayout), or 1/kTileBlocksPerSm of an SM's less what the
// GPU reserves a block and the kernel's static shared memory, when more (a byte past that would
// leave one block an SM). Deep: its tiles', FailedPrecondition where a block may not have
// that much. The first call on a device lets the kernel take that much (past the default 48 KiB),
// shallow ones preferring shared memory to L1 (two blocks an SM take all of it; the tiles bypass
// L1). Deep ones state no preference: asking for all of it kept the chained GEMVs around a small
// batch's attention off its SMs, 1% of a batch-1 decode step (tests/bench/RESULTS.md).
template <int kDim, int kG, bool kLinked, int kStages>
absl::StatusOr<int> PrepareTiledLaunch() {
  static std::mutex mutex;
  static std::map<int, int> prepared;  // bytes by device
  int device = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = prepared.find(device);
  if (it != prepared.end()) return it->second;
  int per_sm = 0, reserved = 0, per_block = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  constexpr int kNeeded = TileLayout<kDim, kStages>::kBytes;
  if (kNeeded > per_block) {
    return absl::FailedPreconditionError(absl::StrCat("decode attention: ", kStages, " tiles of head_dim ", kDim,
                                                      " need ", kNeeded, " bytes of shared memory a block; device ",
                                                      device, " allows ", per_block));
  }
  auto* kernel = DecodeKernel<kDim, kG, kLinked, kStages>;
  cudaFuncAttributes attributes;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  const int static_bytes = static_cast<int>(attributes.sharedSizeBytes);
  const int bytes =
      kStages == kDeepTileStages
          ? kNeeded
          : std::min(per_block - static_bytes, std::max(kNeeded, per_sm / kTileBlocksPerSm - reserved - static_bytes));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (kStages != kDeepTileStages) {
    LAMINA_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  }
  prepared[device] = bytes;
  return bytes;
}

// A linked kernel's launch: plain, as it waits for its inputs itself, or chained to the wait queued
// ahead of it (DecodeLink::chained_to_wait). It never lets the next kernel start early: that would
// be the next layer's launch, whose blocks would hold SMs while polling for rows not yet sent.
template <typename... Params, typename... Args>
cudaError_t LaunchLinked(void (*kernel)(Params...), dim3 grid, size_t shared_bytes, const DecodeLink& link,
                         cudaStream_t stream, Args&&... args) {
  if (link.chained_to_wait) {
    return LaunchChained(kernel, grid, dim3(kThreads), shared_bytes, stream, std::forward<Args>(args)...);
  }
  kernel<<<grid, kThreads, shared_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

// One DecodeKernel launch of `grid` blocks, kStages deep (0: on the CUDA cores): linked when `link`
// is set, else chained.
template <int kDim, int kG, int kStages>
absl::Status LaunchDecodeBlocks(dim3 grid, const DecodeLink* link, const float* q, int64_t q_stride, bf16* k_cache,
                                bf16* v_cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                                int64_t out_stride, int kv_heads, int window, float q_scale, float* partial_out,
                                float* partial_lse, cudaStream_t stream) {
  int bytes = 0;
  if (link != nullptr) {
    if constexpr (kStages > 0) {
      LAMINA_ASSIGN_OR_RETURN(bytes, (PrepareTiledLaunch<kDim, kG, true, kStages>()));
    }
    LAMINA_CUDA_RETURN_IF_ERROR(LaunchLinked(DecodeKernel<kDim, kG, true, kStages>, grid, bytes, *link, stream, q,
                                             q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                                             kv_heads, window, q_scale, partial_out, partial_lse, *link));
    return absl::OkStatus();
  }
  if constexpr (kStages > 0) {
    LAMINA_ASSIGN_OR_RETURN(bytes, (PrepareTiledLaunch<kDim, kG, false, kStages>()));
  }
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(DecodeKernel<kDim, kG, false, kStages>, grid, dim3(kThreads), bytes, stream,
                                            q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                                            kv_heads, window, q_scale, partial_out, partial_lse, DecodeLink{}));
  return absl::OkStatus();
}

// `link` null: plain decode attention (k_cache and v_cache only read); else the linked variant.
template <int kDim, int kG>
absl::Status LaunchDecode(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                          bf16* k_cache, bf16* v_cache, const int32_t* slot_ids, const int32_t* slot_begin,
                          float* out, int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                          cudaStream_t stream) {
  const float q_scale = 1.4426950408889634f / sqrtf(static_cast<float>(kDim));
  const int kv_heads = static_cast<int>(shape.num_kv_heads);
  const int window = static_cast<int>(shape.sliding_window);
  if (plan.warp_per_head) {
    const unsigned blocks = static_cast<unsigned>(DecodeBlocks(shape, plan, num_seqs));
    const int seqs = static_cast<int>(num_seqs);
    if (link != nullptr) {
      LAMINA_CUDA_RETURN_IF_ERROR(LaunchLinked(WarpDecodeKernel<kDim, kG, true>, dim3(blocks), 0, *link, stream, q,
                                               q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                                               kv_heads, seqs, window, q_scale, *link));
    } else {
      LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(WarpDecodeKernel<kDim, kG, false>, dim3(blocks), dim3(kThreads), 0,
                                                stream, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out,
                                                out_stride, kv_heads, seqs, window, q_scale, DecodeLink{}));
    }
    LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  const dim3 grid(plan.splits, static_cast<unsigned>(shape.num_kv_heads), static_cast<unsigned>(num_seqs));
  float* partial_out = workspace;
  float* partial_lse = plan.splits > 1 ? workspace + num_seqs * shape.num_q_heads * plan.splits * kDim : nullptr;
  auto launch = [&](auto stages) {
    return LaunchDecodeBlocks<kDim, kG, decltype(stages)::value>(grid, link, q, q_stride, k_cache, v_cache, slot_ids,
                                                                 slot_begin, out, out_stride, kv_heads, window, q_scale,
                                                                 partial_out, partial_lse, stream);
  };
  if (!plan.tiled) {
    LAMINA_RETURN_IF_ERROR(launch(std::integral_constant<int, 0>()));
  } else if (plan.deep_tiles) {
    LAMINA_RETURN_IF_ERROR(launch(std::integral_constant<int, kDeepTileStages>()));
  } else {
    LAMINA_RETURN_IF_ERROR(launch(std::integral_constant<int, kShallowTileStages>()));
  }
  // The linked launch merges its splits itself.
  if (link == nullptr && plan.splits > 1) {
    LAMINA_CUDA_RETURN_IF_ERROR(
        LaunchChained(MergeSplitsKernel<kDim>,
                      dim3(static_cast<unsigned>(shape.num_q_heads), static_cast<unsigned>(num_seqs)),
                      dim3(kDim < 32 ? 32 : kDim), 0, stream, partial_out, partial_lse, out, out_stride,
                      static_cast<int>(shape.num_q_heads), plan.splits));
  }
  return absl::OkStatus();
}

template <int kDim>
absl::Status DispatchGroup(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                           bf16* k_cache, bf16* v_cache, const int32_t* slot_ids, const int32_t* slot_begin,
                           float* out, int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                           cudaStream_t stream) {
#define LAMINA_DECODE_CASE(G)                                                                              \
  case G:                                                                                                  \
    return LaunchDecode<kDim, G>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, \
                                 out_stride, num_seqs, workspace, link, stream);
  switch (shape.num_q_heads / shape.num_kv_heads) {
    LAMINA_DECODE_CASE(1)
    LAMINA_DECODE_CASE(2)
    LAMINA_DECODE_CASE(3)
    LAMINA_DECODE_CASE(4)
    LAMINA_DECODE_CASE(5)
    LAMINA_DECODE_CASE(6)
    LAMINA_DECODE_CASE(7)
    LAMINA_DECODE_CASE(8)
    default:
      return absl::InvalidArgumentError(absl::StrCat("CUDA decode attention: ", shape.num_q_heads / shape.num_kv_heads,
                                                     " query heads per KV head (supported: 1 to 8)"));
  }
#undef LAMINA_DECODE_CASE
}

absl::Status Dispatch(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                      bf16* k_cache, bf16* v_cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                      int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                      cudaStream_t stream) {
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError("CUDA decode attention: num_q_heads must be a multiple of num_kv_heads");
  }
  if (plan.splits > 1 && workspace == nullptr) {
    return absl::InvalidArgumentError("CUDA decode attention: a split plan needs its workspace");
  }
  switch (shape.head_dim) {
    case 16:
      return DispatchGroup<16>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                               num_seqs, workspace, link, stream);
    case 32:
      return DispatchGroup<32>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                               num_seqs, workspace, link, stream);
    case 64:
      return DispatchGroup<64>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                               num_seqs, workspace, link, stream);
    case 128:
      return DispatchGroup<128>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                                num_seqs, workspace, link, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA attention: head_dim ", shape.head_dim, " (supported: 16, 32, 64, 128)"));
  }
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
    const absl::StatusOr<int> bytes = PrepareTiledLaunch<kDim, kG, false, kShallowTileStages>();
    const absl::StatusOr<int> linked_bytes = PrepareTiledLaunch<kDim, kG, true, kShallowTileStages>();
    int blocks = 0, linked_blocks = 0;
    if (bytes.ok() && linked_bytes.ok() &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, DecodeKernel<kDim, kG, false, kShallowTileStages>,
                                                      kThreads, *bytes) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&linked_blocks, DecodeKernel<kDim, kG, true, kShallowTileStages>,
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

DecodePlan PlanDecode(const AttentionShape& shape, int64_t num_seqs, int64_t max_context, int num_sms,
                      int blocks_per_sm, bool deep_tiles_fit) {
  // Tiled whatever the batch: in Llama-3-8B decode steps on an H100 the tiled kernel beat the
  // CUDA-core one from batch 1 (8 pairs) on, once deep tiles no longer asked for an SM's whole
  // shared memory (tests/bench/RESULTS.md). The CUDA-core kernel stays for plans that ask for it.
  DecodePlan plan;
  plan.tiled = true;
  const int64_t pairs = std::max<int64_t>(1, num_seqs * shape.num_kv_heads);
  const int64_t context = std::max<int64_t>(1, max_context);
  // At most a pair an SM: the deep pipeline, a block an SM.
  plan.deep_tiles = deep_tiles_fit && pairs <= num_sms;
  // A launch takes as many turns of tiles as its longest block, once per wave of blocks, plus a
  // block's fixed costs (about a tile), plus the merge of the splits (about another). At most a
  // tile a split; past two waves of blocks more splits only add waves.
  const int64_t resident = std::max<int64_t>(1, static_cast<int64_t>(num_sms) * (plan.deep_tiles ? 1 : blocks_per_sm));
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
  // A warp each pays once a block each needs more than a full load of blocks; with fewer, on two
  // H200s, it was as fast at batch 64 and 2 us slower at batch 1 (lamina-bench-kernels).
  plan.warp_per_head = plan.splits == 1 && max_context <= kWarpMaxContext && pairs >= kWarpPairsPerSm * num_sms;
  if (plan.warp_per_head) plan.tiled = plan.deep_tiles = false;
  return plan;
}

DecodePlan PlanDecode(const AttentionShape& shape, int64_t num_seqs, int64_t max_context, int num_sms) {
  return PlanDecode(shape, num_seqs, max_context, num_sms, DecodeBlocksPerSm(shape), DeepTilesFitFor(shape.head_dim));
}

int64_t DecodeBlocks(const AttentionShape& shape, const DecodePlan& plan, int64_t num_seqs) {
  const int64_t pairs = num_seqs * shape.num_kv_heads;
  return plan.warp_per_head ? (pairs + kWarpsPerBlock - 1) / kWarpsPerBlock : pairs * plan.splits;
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
  return Dispatch(shape, plan, q, q_stride, const_cast<bf16*>(k_cache), const_cast<bf16*>(v_cache), slot_ids,
                  slot_begin, out, out_stride, num_seqs, workspace, nullptr, stream);
}

int64_t LinkedDecodeCounters(const AttentionShape& shape, int64_t num_seqs) { return 1 + num_seqs * shape.num_kv_heads; }

absl::Status LinkedDecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q,
                                   int64_t q_stride, bf16* k_cache, bf16* v_cache, const int32_t* slot_ids,
                                   const int32_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                                   float* workspace, const DecodeLink& link, cudaStream_t stream) {
  if (num_seqs <= 0) return absl::InvalidArgumentError("linked decode attention: no sequences (nothing would raise the done flag)");
  if (link.k == nullptr || link.v == nullptr || link.write_slots == nullptr || link.error == nullptr ||
      (link.done == nullptr && link.out_lines == nullptr) || link.counters == nullptr ||
      (link.busy_ns != nullptr && link.busy_start == nullptr)) {
    return absl::InvalidArgumentError(
        "linked decode attention: k, v, write_slots, error and counters are required, done unless the outputs go "
        "as lines, and busy_start with busy_ns");
  }
  if ((link.lines != nullptr || link.out_lines != nullptr) && plan.warp_per_head) {
    return absl::InvalidArgumentError("linked decode attention: lines with a warp-per-head plan");
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
  return Dispatch(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride, num_seqs,
                  workspace, &link, stream);
}

}  // namespace lamina::kernels::cuda
