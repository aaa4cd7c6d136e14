// Decode attention over token slots. One block per (context split, kv head, sequence):
//  - kLanes = head_dim / 8 threads share one token, each holding 8 dims (one 16-byte load of K and
//    one of V); the block's 128 threads form kGroups such token groups;
//  - each group takes kUnroll tokens per iteration, issuing all their K and V loads before the
//    first use, so enough bytes are in flight to saturate memory;
//  - the group's query heads (kG of them) sit in registers, pre-scaled by 1/sqrt(d)·log2(e) so the
//    softmax runs on exp2;
//  - each group keeps its own running max, sum and output; the block merges its groups through
//    shared memory, and a second kernel merges the splits of a sequence.
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "kernels/cuda/attention.h"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 4;
constexpr int kMinChunk = 64;
// Enough resident blocks per SM to keep loads in flight while other warps compute.
constexpr int kBlocksPerSm = 8;

__device__ __forceinline__ void Unpack8(const uint4& raw, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

template <int kDim, int kG>
__global__ void __launch_bounds__(kThreads) DecodeKernel(
    const float* __restrict__ q, int64_t q_stride, const bf16* __restrict__ k_cache,
    const bf16* __restrict__ v_cache, const int32_t* __restrict__ slot_ids,
    const int32_t* __restrict__ slot_begin, float* __restrict__ out, int64_t out_stride, int num_kv_heads,
    int sliding_window, float q_scale, float* __restrict__ partial_out, float* __restrict__ partial_lse) {
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

  float qr[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const float* src = q + seq * q_stride + (kv_head * kG + g) * kDim + lane * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) qr[g][i] = src[i] * q_scale;
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

  const int64_t head_offset = static_cast<int64_t>(kv_head) * kDim + lane * 8;
  const int64_t slot_stride = static_cast<int64_t>(num_kv_heads) * kDim;
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
}

// One block per (sequence, head): weights each split by 2^(lse - max lse).
template <int kDim>
__global__ void MergeSplitsKernel(const float* __restrict__ partial_out, const float* __restrict__ partial_lse,
                                  float* __restrict__ out, int64_t out_stride, int num_heads, int splits) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int64_t row0 = (static_cast<int64_t>(seq) * num_heads + head) * splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, partial_lse[row0 + s]);
  for (int d = threadIdx.x; d < kDim; d += blockDim.x) {
    float sum = 0.f;
    float o = 0.f;
    if (m != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float w = exp2f(partial_lse[row0 + s] - m);
        sum += w;
        o += w * partial_out[(row0 + s) * kDim + d];
      }
    }
    out[seq * out_stride + head * kDim + d] = sum > 0.f ? o / sum : 0.f;
  }
}

template <int kDim, int kG>
absl::Status LaunchDecode(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                          const bf16* k_cache, const bf16* v_cache, const int32_t* slot_ids,
                          const int32_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                          float* workspace, cudaStream_t stream) {
  const float q_scale = 1.4426950408889634f / sqrtf(static_cast<float>(kDim));
  const dim3 grid(plan.splits, static_cast<unsigned>(shape.num_kv_heads), static_cast<unsigned>(num_seqs));
  float* partial_out = workspace;
  float* partial_lse = plan.splits > 1 ? workspace + num_seqs * shape.num_q_heads * plan.splits * kDim : nullptr;
  DecodeKernel<kDim, kG><<<grid, kThreads, 0, stream>>>(
      q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride, static_cast<int>(shape.num_kv_heads),
      static_cast<int>(shape.sliding_window), q_scale, partial_out, partial_lse);
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
                           const bf16* k_cache, const bf16* v_cache, const int32_t* slot_ids,
                           const int32_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                           float* workspace, cudaStream_t stream) {
#define LAMINA_DECODE_CASE(G)                                                                              \
  case G:                                                                                                  \
    return LaunchDecode<kDim, G>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, \
                                 out_stride, num_seqs, workspace, stream);
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
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError("CUDA decode attention: num_q_heads must be a multiple of num_kv_heads");
  }
  if (plan.splits > 1 && workspace == nullptr) {
    return absl::InvalidArgumentError("CUDA decode attention: a split plan needs its workspace");
  }
  switch (shape.head_dim) {
    case 16:
      return DispatchGroup<16>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                               num_seqs, workspace, stream);
    case 32:
      return DispatchGroup<32>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                               num_seqs, workspace, stream);
    case 64:
      return DispatchGroup<64>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                               num_seqs, workspace, stream);
    case 128:
      return DispatchGroup<128>(shape, plan, q, q_stride, k_cache, v_cache, slot_ids, slot_begin, out, out_stride,
                                num_seqs, workspace, stream);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA attention: head_dim ", shape.head_dim, " (supported: 16, 32, 64, 128)"));
  }
}

}  // namespace lamina::kernels::cuda
