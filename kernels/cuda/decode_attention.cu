// Decode attention over token slots. One block per (context split, kv head, sequence):
//  - kLanes = head_dim / 8 threads share one token, each holding 8 dims (one 16-byte load of K and
//    one of V); the block's 128 threads form kGroups such token groups;
//  - each group takes kUnroll tokens per iteration, issuing all their K and V loads before the
//    first use, so enough bytes are in flight to saturate memory;
//  - the group's query heads (kG of them) sit in registers, pre-scaled by 1/sqrt(d)·log2(e) so the
//    softmax runs on exp2;
//  - each group keeps its own running max, sum and output; the block merges its groups through
//    shared memory, and a second kernel merges the splits of a sequence.
// The linked variant (LinkedDecodeAttention) is the same kernel with its data-plane hop folded in:
// one thread per block waits for the inputs' flag, the split holding a sequence's new token stores
// its k/v first, the last split of a (sequence, kv head) to finish merges the splits itself, and
// the last block to write its outputs raises the done flag. One launch per layer, no host.
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flags.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 4;
constexpr int kMinChunk = 64;
// Enough resident blocks per SM to keep loads in flight while other warps compute.
constexpr int kBlocksPerSm = 8;

// Thread 0 of each block waits for the inputs (SpinOnFlag); the barrier then releases the block.
__device__ void WaitForInputs(const DecodeLink& link) {
  if (threadIdx.x == 0 && link.ready != nullptr) {
    SpinOnFlag(link.ready, link.ready_value, link.timeout_ns, link.error, link.error_code);
  }
  __syncthreads();
}

__device__ __forceinline__ void Unpack8(const uint4& raw, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// The splits of row `row0` onwards, merged: weights each split by 2^(lse - max lse). Loads bypass
// L1, since other blocks of the same launch may have written the partials.
template <int kDim>
__device__ float MergedOutput(const float* partial_out, const float* partial_lse, int64_t row0, int splits, int d) {
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, __ldcg(partial_lse + row0 + s));
  if (m == -INFINITY) return 0.f;
  float sum = 0.f;
  float o = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float w = exp2f(__ldcg(partial_lse + row0 + s) - m);
    sum += w;
    o += w * __ldcg(partial_out + (row0 + s) * kDim + d);
  }
  return sum > 0.f ? o / sum : 0.f;
}

// k_cache and v_cache are written only when kLinked (the new tokens' k/v).
template <int kDim, int kG, bool kLinked>
__global__ void __launch_bounds__(kThreads) DecodeKernel(
    const float* __restrict__ q, int64_t q_stride, bf16* k_cache, bf16* v_cache,
    const int32_t* __restrict__ slot_ids, const int32_t* __restrict__ slot_begin, float* __restrict__ out,
    int64_t out_stride, int num_kv_heads, int sliding_window, float q_scale, float* __restrict__ partial_out,
    float* __restrict__ partial_lse, DecodeLink link) {
  constexpr int kLanes = kDim / 8;
  constexpr int kGroups = kThreads / kLanes;
  const int split = blockIdx.x;
  const int splits = gridDim.x;
  const int kv_head = blockIdx.y;
  const int seq = blockIdx.z;
  const int lane = threadIdx.x % kLanes;
  const int group = threadIdx.x / kLanes;

  int begin = slot_begin[seq];
  const int end = slot_begin[seq + 1];
  if (sliding_window > 0 && end - begin > sliding_window) begin = end - sliding_window;
  const int chunk = (end - begin + splits - 1) / splits;
  const int lo = begin + split * chunk;
  const int hi = min(end, lo + chunk);
  const int64_t head_offset = static_cast<int64_t>(kv_head) * kDim + lane * 8;
  const int64_t slot_stride = static_cast<int64_t>(num_kv_heads) * kDim;

  if (kLinked) {
    WaitForInputs(link);
    const bool first_block = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    if (link.busy_ns != nullptr && first_block && threadIdx.x == 0) *link.busy_start = GlobalTimerNs();
    // The new token is the context's last; the split attending to it stores it first. The barrier
    // makes the block's own stores visible to its loads below.
    if (end - 1 >= lo && end - 1 < hi) {
      const int64_t from = seq * link.kv_stride + kv_head * kDim;
      const int64_t to = static_cast<int64_t>(link.write_slots[seq]) * slot_stride + kv_head * kDim;
      for (int d = threadIdx.x; d < kDim; d += kThreads) {
        k_cache[to + d] = __float2bfloat16(__ldcg(link.k + from + d));
        v_cache[to + d] = __float2bfloat16(__ldcg(link.v + from + d));
      }
    }
    __syncthreads();
  }

  // Through L2: with kLinked the rows were just written by a peer GPU.
  float qr[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const float* src = q + seq * q_stride + (kv_head * kG + g) * kDim + lane * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) qr[g][i] = __ldcg(src + i) * q_scale;
  }
  float acc[kG][8];
  float run_max[kG];
  float run_sum[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    run_max[g] = -INFINITY;
    run_sum[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }

  // The loop runs while the warp's first group has tokens, so every lane of a warp takes the same
  // trip count (the shuffles need the whole warp); a group past the end masks its tokens.
  constexpr int kGroupsPerWarp = 32 / kLanes;
  const int warp_first_group = group / kGroupsPerWarp * kGroupsPerWarp;
  for (int t0 = lo + group * kUnroll, w0 = lo + warp_first_group * kUnroll; w0 < hi;
       t0 += kGroups * kUnroll, w0 += kGroups * kUnroll) {
    uint4 kraw[kUnroll];
    uint4 vraw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = t0 + u;
      if (t < hi) {
        const int64_t base = static_cast<int64_t>(slot_ids[t]) * slot_stride + head_offset;
        kraw[u] = __ldcs(reinterpret_cast<const uint4*>(k_cache + base));
        vraw[u] = __ldcs(reinterpret_cast<const uint4*>(v_cache + base));
      } else {
        kraw[u] = make_uint4(0, 0, 0, 0);
        vraw[u] = make_uint4(0, 0, 0, 0);
      }
    }
    float score[kUnroll][kG];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[8];
      Unpack8(kraw[u], kf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = fmaf(qr[g][i], kf[i], dot);
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        score[u][g] = (t0 + u < hi) ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float m = run_max[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m = fmaxf(m, score[u][g]);
      if (m == -INFINITY) continue;  // nothing valid seen yet
      const float correction = exp2f(run_max[g] - m);
      run_sum[g] *= correction;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= correction;
      run_max[g] = m;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = exp2f(score[u][g] - m);
        run_sum[g] += p;
        float vf[8];
        Unpack8(vraw[u], vf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
      }
    }
  }

  // Merge the groups of the block: [group][g] maxima and sums, [group][g][dim] outputs.
  __shared__ float shared_max[kGroups][kG];
  __shared__ float shared_sum[kGroups][kG];
  __shared__ float shared_acc[kGroups][kG][kDim];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (lane == 0) {
      shared_max[group][g] = run_max[g];
      shared_sum[group][g] = run_sum[g];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) shared_acc[group][g][lane * 8 + i] = acc[g][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kG * kDim; idx += kThreads) {
    const int g = idx / kDim;
    const int d = idx % kDim;
    float m = -INFINITY;
    for (int j = 0; j < kGroups; ++j) m = fmaxf(m, shared_max[j][g]);
    float sum = 0.f;
    float o = 0.f;
    if (m != -INFINITY) {
      for (int j = 0; j < kGroups; ++j) {
        const float w = exp2f(shared_max[j][g] - m);
        sum += shared_sum[j][g] * w;
        o += shared_acc[j][g][d] * w;
      }
    }
    const int head = kv_head * kG + g;
    if (splits == 1) {
      out[seq * out_stride + head * kDim + d] = sum > 0.f ? o / sum : 0.f;
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * num_kv_heads * kG + head) * splits + split;
      partial_out[row * kDim + d] = sum > 0.f ? o / sum : 0.f;
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
    for (int idx = threadIdx.x; idx < kG * kDim; idx += kThreads) {
      const int head = kv_head * kG + idx / kDim;
      const int d = idx % kDim;
      const int64_t row0 = (static_cast<int64_t>(seq) * num_kv_heads * kG + head) * splits;
      out[seq * out_stride + head * kDim + d] = MergedOutput<kDim>(partial_out, partial_lse, row0, splits, d);
    }
  }
  if (ArriveAndRaise(link.counters, writers, link.done, link.done_value, link.error) && link.busy_ns != nullptr) {
    // The first block's start is ordered before this through every block's arrival.
    const unsigned long long end = GlobalTimerNs();
    const unsigned long long start = *const_cast<volatile uint64_t*>(link.busy_start);
    auto* words = reinterpret_cast<unsigned long long*>(link.busy_ns);
    const unsigned long long from = max(start, atomicMax(&words[1], end));
    if (end > from) atomicAdd(&words[0], end - from);
  }
}

// One block per (sequence, head): weights each split by 2^(lse - max lse).
template <int kDim>
__global__ void MergeSplitsKernel(const float* __restrict__ partial_out, const float* __restrict__ partial_lse,
                                  float* __restrict__ out, int64_t out_stride, int num_heads, int splits) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int64_t row0 = (static_cast<int64_t>(seq) * num_heads + head) * splits;
  for (int d = threadIdx.x; d < kDim; d += blockDim.x) {
    out[seq * out_stride + head * kDim + d] = MergedOutput<kDim>(partial_out, partial_lse, row0, splits, d);
  }
}

// `link` null: plain decode attention (k_cache and v_cache only read); else the linked variant.
template <int kDim, int kG>
absl::Status LaunchDecode(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                          bf16* k_cache, bf16* v_cache, const int32_t* slot_ids, const int32_t* slot_begin,
                          float* out, int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                          cudaStream_t stream) {
  const float q_scale = 1.4426950408889634f / sqrtf(static_cast<float>(kDim));
  const dim3 grid(plan.splits, static_cast<unsigned>(shape.num_kv_heads), static_cast<unsigned>(num_seqs));
  float* partial_out = workspace;
  float* partial_lse = plan.splits > 1 ? workspace + num_seqs * shape.num_q_heads * plan.splits * kDim : nullptr;
  const int kv_heads = static_cast<int>(shape.num_kv_heads);
  const int window = static_cast<int>(shape.sliding_window);
  if (link != nullptr) {
    DecodeKernel<kDim, kG, true><<<grid, kThreads, 0, stream>>>(q, q_stride, k_cache, v_cache, slot_ids, slot_begin,
                                                                out, out_stride, kv_heads, window, q_scale,
                                                                partial_out, partial_lse, *link);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  DecodeKernel<kDim, kG, false><<<grid, kThreads, 0, stream>>>(q, q_stride, k_cache, v_cache, slot_ids, slot_begin,
                                                               out, out_stride, kv_heads, window, q_scale,
                                                               partial_out, partial_lse, DecodeLink{});
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (plan.splits > 1) {
    MergeSplitsKernel<kDim><<<dim3(static_cast<unsigned>(shape.num_q_heads), static_cast<unsigned>(num_seqs)),
                              kDim < 32 ? 32 : kDim, 0, stream>>>(partial_out, partial_lse, out, out_stride,
                                                                  static_cast<int>(shape.num_q_heads), plan.splits);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
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

}  // namespace

DecodePlan PlanDecode(const AttentionShape& shape, int64_t num_seqs, int64_t max_context, int num_sms) {
  DecodePlan plan;
  const int64_t blocks = std::max<int64_t>(1, num_seqs * shape.num_kv_heads);
  const int64_t wanted = (kBlocksPerSm * static_cast<int64_t>(num_sms) + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, max_context / kMinChunk);
  plan.splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, most)));
  if (plan.splits > 1) plan.workspace_floats = num_seqs * shape.num_q_heads * plan.splits * (shape.head_dim + 1);
  return plan;
}

absl::Status DecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                             const bf16* k_cache, const bf16* v_cache, const int32_t* slot_ids,
                             const int32_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                             float* workspace, cudaStream_t stream) {
  if (num_seqs == 0) return absl::OkStatus();
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
      link.done == nullptr || link.counters == nullptr || (link.busy_ns != nullptr && link.busy_start == nullptr)) {
    return absl::InvalidArgumentError(
        "linked decode attention: k, v, write_slots, error, done and counters are required, and busy_start with "
        "busy_ns");
  }
  return Dispatch(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride, num_seqs,
                  workspace, &link, stream);
}

}  // namespace lamina::kernels::cuda
