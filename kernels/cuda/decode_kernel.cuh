// The decode attention kernel's device code and launches, shared by the bf16 cache's
// (decode_attention.cu) and the float8 cache's (float8_kv.cu) entry points, each of which
// instantiates the kernels of its cache alone: the two compile side by side. decode_attention.cu's
// opening comment tells how the kernel works. Include only from those two files.
#ifndef LAMINA_KERNELS_CUDA_DECODE_KERNEL_CUH_
#define LAMINA_KERNELS_CUDA_DECODE_KERNEL_CUH_

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
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

// `cache` (Bf16KvLayer or Float8KvLayer) is written only when kLinked (the new tokens' k/v).
// kStages > 0: the block attends on the tensor cores (decode_tiles.cuh), kStages tiles in dynamic
// shared memory; 0: its 128 threads form kGroups token groups of kLanes lanes (AttendTokens), over
// a bf16 cache only.
template <int kDim, int kG, bool kLinked, int kStages, typename Kv>
__global__ void __launch_bounds__(kTileThreads)
    DecodeKernel(const float* __restrict__ q, int64_t q_stride, Kv cache, const int32_t* __restrict__ slot_ids,
                 const int32_t* __restrict__ slot_begin, float* __restrict__ out, int64_t out_stride, int num_kv_heads,
                 int sliding_window, float q_scale, float* __restrict__ partial_out, float* __restrict__ partial_lse,
                 DecodeLink link) {
  constexpr bool kTiled = kStages > 0;
  constexpr bool kFloat8 = kIsFloat8<Kv>;
  static_assert(kTiled || !kFloat8, "a float8 cache is attended tiled only");
  constexpr int kThreads = kTileThreads;
  // Tiled: TileLayout<kDim, kStages, kFloat8>::kBytes at least.
  extern __shared__ __align__(16) unsigned char tile_smem[];
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
  using Tiles = TileStream<kDim, kTiled ? kStages : kShallowTileStages, Kv>;
  const Tiles tiles{cache, slot_ids, slot_stride, static_cast<int64_t>(kv_head) * kDim, lo, hi, tile_smem};
  const bool tiles_started = kTiled && lo + Tiles::kTilesAhead * kTileTokens < end;
  if constexpr (kTiled) {
    if (tiles_started) tiles.StartTiles();
    if (!kLinked) WaitForPreviousKernel();
  }

  // Whether a wait of the step gave up, as this block knows it before attending.
  bool failed = false;
  // The query heads, from lines or packets; once attended, the outputs bound for packets.
  __shared__ __align__(16) float q_polled[kLinked ? kG * kDim : 1];
  // The new token's k, then v, from packets (or from lines, float8).
  __shared__ float kv_polled[kLinked ? 2 * kDim : 1];
  if (kLinked) {
    // The new token is the context's last; the split attending to it stores it first.
    const bool holds_new_token = end - 1 >= lo && end - 1 < hi;
    // Float8: the new token's k and v, dim threadIdx.x of each, for quantizing its heads.
    float new_k = 0.f, new_v = 0.f;
    if (link.lines != nullptr) {
      if constexpr (kFloat8) {
        failed = ReceiveInputLines<kDim, kG>(link, q, q_stride, seq, kv_head, q_polled, holds_new_token,
                                             [&](bool is_k, int d, float2 x) {
                                               kv_polled[(is_k ? 0 : kDim) + d] = x.x;
                                               kv_polled[(is_k ? 0 : kDim) + d + 1] = x.y;
                                             });
        if (holds_new_token && threadIdx.x < kDim) {
          new_k = kv_polled[threadIdx.x];
          new_v = kv_polled[kDim + threadIdx.x];
        }
      } else {
        // Its slot is read before the polls, off the hop's path.
        const int64_t slot = holds_new_token ? link.write_slots[seq] * slot_stride + kv_head * kDim : 0;
        failed = ReceiveInputLines<kDim, kG>(
            link, q, q_stride, seq, kv_head, q_polled, holds_new_token, [&](bool is_k, int d, float2 x) {
              *reinterpret_cast<__nv_bfloat162*>((is_k ? cache.k : cache.v) + slot + d) =
                  __floats2bfloat162_rn(x.x, x.y);
            });
      }
    } else if (link.packets != nullptr) {
      // Its slot is read before the polls, off the hop's path.
      const int64_t slot =
          !kFloat8 && holds_new_token ? link.write_slots[seq] * slot_stride + kv_head * kDim : 0;
      failed = SyncOr<kThreads>(PollInputPackets<kDim, kG, kThreads>(link, q, q_stride, seq, kv_head, q_polled,
                                                                     kv_polled, holds_new_token, threadIdx.x));
      if (holds_new_token) {
        if constexpr (kFloat8) {
          if (threadIdx.x < kDim) {
            new_k = kv_polled[threadIdx.x];
            new_v = kv_polled[kDim + threadIdx.x];
          }
        } else {
          StorePolledToken<kDim>(cache, slot, kv_polled, threadIdx.x, kThreads);
        }
      }
    } else {
      WaitForInputs(link);
      // Only output lines and packets need it; the load stays in flight while the block attends.
      failed = (link.out_lines != nullptr || link.out_packets != nullptr) && ErrorSet(link.error);
      if (holds_new_token) {
        if constexpr (kFloat8) {
          const int64_t from = seq * link.kv_stride + kv_head * kDim + threadIdx.x;
          if (threadIdx.x < kDim) {
            new_k = __ldcg(link.k + from);
            new_v = __ldcg(link.v + from);
          }
        } else {
          StoreNewToken<kDim>(link, cache, seq, kv_head, slot_stride, threadIdx.x, kThreads);
        }
      }
    }
    if constexpr (kFloat8) {
      if (holds_new_token) StoreNewTokenFloat8<kDim>(link, cache, seq, kv_head, num_kv_heads, new_k, new_v);
    }
    // The barrier makes the block's own stores visible to its loads below (polled lines' bf16
    // stores came before ReceiveInputLines' own).
    if (kFloat8 || link.lines == nullptr) __syncthreads();
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
    auto make_query = [&](uint32_t(&high)[kDim / 16][2], uint32_t(&low)[kDim / 16][2]) {
      if (kLinked && (link.lines != nullptr || link.packets != nullptr)) {
        QueryFragments<kDim, kG, kFloat8>([&](int i) { return q_polled[i]; }, q_scale, high, low);
      } else {
        // Through L2: with a link the rows were just written by a peer GPU.
        const float* q_heads = q + seq * q_stride + kv_head * kG * kDim;
        QueryFragments<kDim, kG, kFloat8>([&](int i) { return __ldcg(q_heads + i); }, q_scale, high, low);
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
      // Rows lane / 4 and lane / 4 + 8 of product d: dims 16d + lane / 4 and 8 on, or, float8,
      // dims (lane / 4)·kDim/8 + 2d and the next (AttendWarpFloat8Tokens).
      float* to = shared_acc + (warp * kG + head) * kDim + (kFloat8 ? lane / 4 * (kDim / 8) : lane / 4);
#pragma unroll
      for (int d = 0; d < kDim / 16; ++d) {
        to[kFloat8 ? 2 * d : 16 * d] = rows.o[d][h];
        to[kFloat8 ? 2 * d + 1 : 16 * d + 8] = rows.o[d][2 + h];
      }
    }
  } else if constexpr (!kFloat8) {
    constexpr int kLanes = kDim / 8;
    const int lane = threadIdx.x % kLanes;
    const int group = threadIdx.x / kLanes;
    float qr[kG][8];
    if (kLinked && (link.lines != nullptr || link.packets != nullptr)) {
      LoadPolledQuery<kDim, kG>(q_polled, lane, q_scale, qr);
    } else {
      LoadQuery<kDim, kG>(q, q_stride, seq, kv_head * kG, lane, q_scale, qr);
    }
    float acc[kG][8];
    float run_max[kG];
    float run_sum[kG];
    constexpr int kGroupsPerWarp = 32 / kLanes;
    AttendTokens<kDim, kG>(qr, cache.k, cache.v, slot_ids, slot_stride, static_cast<int64_t>(kv_head) * kDim + lane * 8,
                           lo, hi, group, group / kGroupsPerWarp * kGroupsPerWarp, kParts, acc, run_max, run_sum);
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
    const float scale = OutputScale(sum);
    const float first = o[0] * scale, second = o[1] * scale;
    if (kLinked && splits == 1 && link.out_packets != nullptr) {
      q_polled[idx] = first;  // the query heads are read by now (the barrier above)
      q_polled[idx + 1] = second;
    } else if (splits == 1) {
      PutOutputPair(kLinked ? &link : nullptr, failed, out, seq * out_stride + head * kDim + d, first, second);
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * num_kv_heads * kG + head) * splits + split;
      partial_out[row * kDim + d] = first;
      partial_out[row * kDim + d + 1] = second;
      if (d == 0) partial_lse[row] = sum > 0.f ? m + log2f(sum) : -INFINITY;
    }
  }
  if (!kLinked) return;
  if (splits == 1 && link.out_packets != nullptr) {
    SendOutputPackets<kDim, kG, kThreads>(link, q_polled, seq, kv_head, num_kv_heads, failed, threadIdx.x);
  }

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
    const bool out_packets = link.out_packets != nullptr;
    if (link.out_lines != nullptr || out_packets) failed = failed || ErrorSet(link.error);
    MergeSplits<kDim, kG>(partial_out, partial_lse, seq, kv_head, num_kv_heads, splits, link, failed, out, out_stride,
                          out_packets ? q_polled : nullptr);
    if (out_packets) {
      SendOutputPackets<kDim, kG, kThreads>(link, q_polled, seq, kv_head, num_kv_heads, failed, threadIdx.x);
    }
  }
  ArriveAndFinish(link, writers);
}

// One block per (sequence, head): weights each split by 2^(lse - max lse). The block loads the
// splits' lse once, into shared memory, and each thread then reads its dimension of every split
// eight at a time.
constexpr int kMaxMergedSplits = 1024;  // also PlanDecode's limit
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
    out[seq * out_stride + head * kDim + d] = o * OutputScale(sum);
  }
}

// Two blocks of DecodeKernel an SM stream the cache fastest: a third one (the registers allow
// three) makes every large batch slower. A launch asks for enough shared memory to keep it at two.
constexpr int kTileBlocksPerSm = 2;

// The dynamic shared memory of a tiled DecodeKernel<kDim, kG, kLinked, kStages, Kv> launch on the
// current device. Shallow: its tiles' (TileLayout), or 1/kTileBlocksPerSm of an SM's less what the
// GPU reserves a block and the kernel's static shared memory, when more (a byte past that would
// leave one block an SM). Deep: its tiles', FailedPrecondition where a block may not have
// that much. The first call on a device lets the kernel take that much (past the default 48 KiB),
// shallow ones preferring shared memory to L1 (two blocks an SM take all of it; the tiles bypass
// L1). Deep ones state no preference: asking for all of it kept the chained GEMVs around a small
// batch's attention off its SMs, 1% of a batch-1 decode step (tests/bench/RESULTS.md).
template <int kDim, int kG, bool kLinked, int kStages, typename Kv>
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
  constexpr int kNeeded = TileLayout<kDim, kStages, kIsFloat8<Kv>>::kBytes;
  if (kNeeded > per_block) {
    return absl::FailedPreconditionError(absl::StrCat("decode attention: ", kStages, " tiles of head_dim ", kDim,
                                                      " need ", kNeeded, " bytes of shared memory a block; device ",
                                                      device, " allows ", per_block));
  }
  auto* kernel = DecodeKernel<kDim, kG, kLinked, kStages, Kv>;
  cudaFuncAttributes attributes;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  const int static_bytes = static_cast<int>(attributes.sharedSizeBytes);
  // Float8's deep tiles take half bf16's bytes, which two blocks an SM could hold: a chained
  // launch asks for a byte past half an SM, so that its early blocks do not pair up on SMs while
  // others idle (small batches take far longer so). A linked launch is not chained, and is slower
  // asking so.
  const int one_an_sm = per_sm / 2 - reserved - static_bytes + 1;
  const bool one_block_an_sm = kIsFloat8<Kv> && !kLinked;
  const int bytes =
      kStages == kDeepTileStages
          ? (one_block_an_sm ? std::min(per_block - static_bytes, std::max(kNeeded, one_an_sm)) : kNeeded)
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
cudaError_t LaunchLinked(void (*kernel)(Params...), dim3 grid, unsigned threads, size_t shared_bytes,
                         const DecodeLink& link, cudaStream_t stream, Args&&... args) {
  if (link.chained_to_wait) {
    return LaunchChained(kernel, grid, dim3(threads), shared_bytes, stream, std::forward<Args>(args)...);
  }
  kernel<<<grid, threads, shared_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

// One DecodeKernel launch of `grid` blocks, kStages deep (0: on the CUDA cores): linked when `link`
// is set, else chained.
template <int kDim, int kG, int kStages, typename Kv>
absl::Status LaunchDecodeBlocks(dim3 grid, const DecodeLink* link, const float* q, int64_t q_stride, const Kv& cache,
                                const int32_t* slot_ids, const int32_t* slot_begin, float* out, int64_t out_stride,
                                int kv_heads, int window, float q_scale, float* partial_out, float* partial_lse,
                                cudaStream_t stream) {
  int bytes = 0;
  if (link != nullptr) {
    if constexpr (kStages > 0) {
      LAMINA_ASSIGN_OR_RETURN(bytes, (PrepareTiledLaunch<kDim, kG, true, kStages, Kv>()));
    }
    LAMINA_CUDA_RETURN_IF_ERROR(LaunchLinked(DecodeKernel<kDim, kG, true, kStages, Kv>, grid, kTileThreads, bytes,
                                             *link, stream, q, q_stride, cache, slot_ids, slot_begin, out, out_stride,
                                             kv_heads, window, q_scale, partial_out, partial_lse, *link));
    return absl::OkStatus();
  }
  if constexpr (kStages > 0) {
    LAMINA_ASSIGN_OR_RETURN(bytes, (PrepareTiledLaunch<kDim, kG, false, kStages, Kv>()));
  }
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(DecodeKernel<kDim, kG, false, kStages, Kv>, grid, dim3(kTileThreads), bytes,
                                            stream, q, q_stride, cache, slot_ids, slot_begin, out, out_stride, kv_heads,
                                            window, q_scale, partial_out, partial_lse, DecodeLink{}));
  return absl::OkStatus();
}

// A launch of DecodeKernel blocks under `plan` (kBlockPerHead, kTiled or kDeepTiled; tiled over a float8 cache),
// and of the merge of its splits unless linked (the linked launch merges them itself).
template <int kDim, int kG, typename Kv>
absl::Status LaunchBlockDecode(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                               const Kv& cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                               int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                               cudaStream_t stream) {
  if (plan.splits > 1 && workspace == nullptr) {
    return absl::InvalidArgumentError("CUDA decode attention: a split plan needs its workspace");
  }
  const float q_scale = 1.4426950408889634f / sqrtf(static_cast<float>(kDim));
  const int kv_heads = static_cast<int>(shape.num_kv_heads);
  const int window = static_cast<int>(shape.sliding_window);
  const dim3 grid(plan.splits, static_cast<unsigned>(shape.num_kv_heads), static_cast<unsigned>(num_seqs));
  float* partial_out = workspace;
  float* partial_lse = plan.splits > 1 ? workspace + num_seqs * shape.num_q_heads * plan.splits * kDim : nullptr;
  auto launch = [&](auto stages) {
    return LaunchDecodeBlocks<kDim, kG, decltype(stages)::value>(grid, link, q, q_stride, cache, slot_ids, slot_begin,
                                                                 out, out_stride, kv_heads, window, q_scale,
                                                                 partial_out, partial_lse, stream);
  };
  if (plan.strategy == DecodeStrategy::kDeepTiled) {
    LAMINA_RETURN_IF_ERROR(launch(std::integral_constant<int, kDeepTileStages>()));
  } else if (plan.tiled() || kIsFloat8<Kv>) {
    LAMINA_RETURN_IF_ERROR(launch(std::integral_constant<int, kShallowTileStages>()));
  } else if constexpr (!kIsFloat8<Kv>) {
    LAMINA_RETURN_IF_ERROR(launch(std::integral_constant<int, 0>()));
  }
  if (link == nullptr && plan.splits > 1) {
    LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(
        MergeSplitsKernel<kDim>, dim3(static_cast<unsigned>(shape.num_q_heads), static_cast<unsigned>(num_seqs)),
        dim3(kDim < 32 ? 32 : kDim), 0, stream, partial_out, partial_lse, out, out_stride,
        static_cast<int>(shape.num_q_heads), plan.splits));
  }
  return absl::OkStatus();
}

// Calls launch(std::integral_constant<int, head_dim>(), std::integral_constant<int, group>()) for
// the shape's head_dim and query heads per kv head; InvalidArgument naming an unsupported one.
template <typename Launch>
absl::Status DispatchShape(const AttentionShape& shape, const Launch& launch) {
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError("CUDA decode attention: num_q_heads must be a multiple of num_kv_heads");
  }
  auto with_group = [&](auto dim) -> absl::Status {
    using Dim = decltype(dim);
    switch (shape.num_q_heads / shape.num_kv_heads) {
      case 1:
        return launch(Dim(), std::integral_constant<int, 1>());
      case 2:
        return launch(Dim(), std::integral_constant<int, 2>());
      case 3:
        return launch(Dim(), std::integral_constant<int, 3>());
      case 4:
        return launch(Dim(), std::integral_constant<int, 4>());
      case 5:
        return launch(Dim(), std::integral_constant<int, 5>());
      case 6:
        return launch(Dim(), std::integral_constant<int, 6>());
      case 7:
        return launch(Dim(), std::integral_constant<int, 7>());
      case 8:
        return launch(Dim(), std::integral_constant<int, 8>());
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("CUDA decode attention: ", shape.num_q_heads / shape.num_kv_heads,
                         " query heads per KV head (supported: 1 to 8)"));
    }
  };
  switch (shape.head_dim) {
    case 16:
      return with_group(std::integral_constant<int, 16>());
    case 32:
      return with_group(std::integral_constant<int, 32>());
    case 64:
      return with_group(std::integral_constant<int, 64>());
    case 128:
      return with_group(std::integral_constant<int, 128>());
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA attention: head_dim ", shape.head_dim, " (supported: 16, 32, 64, 128)"));
  }
}

// Checks a linked launch's fields against its plan and strides (LinkedDecodeAttention's contract).
absl::Status CheckDecodeLink(const DecodePlan& plan, int64_t num_seqs, const float* q, int64_t q_stride,
                             int64_t out_stride, const DecodeLink& link);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_DECODE_KERNEL_CUH_
