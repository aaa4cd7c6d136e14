// Decode attention on the CUDA cores (kBlockPerHead and kWarpPerHead plans): a token group
// of kDim / 8 lanes shares each token, every lane holding 8 dims of k, v and the kv head's query
// heads in registers, and takes kCoreUnroll tokens a turn with all their loads issued before the
// first use. Include only from decode_attention.cu.
#ifndef LAMINA_KERNELS_CUDA_DECODE_CORES_CUH_
#define LAMINA_KERNELS_CUDA_DECODE_CORES_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/packed.cuh"

namespace lamina::kernels::cuda {

constexpr int kCoreUnroll = 4;

// Each lane's 8 dims of kG query heads from `head` on, pre-scaled. Through L2: with a link the rows
// were just written by a peer GPU. Two 16-byte loads a head where the rows allow: scalar loads
// fetch each 32-byte sector from L2 eight times over. Not at head_dim 32, where ptxas spilled with
// them (at 6 query heads a kv head).
template <int kDim, int kG>
__device__ __forceinline__ void LoadQuery(const float* q, int64_t q_stride, int seq, int head, int lane,
                                          float q_scale, float (&qr)[kG][8]) {
  const float* src = q + seq * q_stride + head * kDim + lane * 8;
  if (kDim >= 64 && (reinterpret_cast<uintptr_t>(q) & 15) == 0 && (q_stride & 3) == 0) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float4 lo = __ldcg(reinterpret_cast<const float4*>(src + g * kDim));
      const float4 hi = __ldcg(reinterpret_cast<const float4*>(src + g * kDim + 4));
      qr[g][0] = lo.x, qr[g][1] = lo.y, qr[g][2] = lo.z, qr[g][3] = lo.w;
      qr[g][4] = hi.x, qr[g][5] = hi.y, qr[g][6] = hi.z, qr[g][7] = hi.w;
    }
  } else {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
#pragma unroll
      for (int i = 0; i < 8; ++i) qr[g][i] = __ldcg(src + g * kDim + i);
    }
  }
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int i = 0; i < 8; ++i) qr[g][i] *= q_scale;
  }
}

// A token group's turn: kCoreUnroll tokens' k and v, the lane's 8 dims of each as bf16.
struct CoreTurn {
  uint4 k[kCoreUnroll];
  uint4 v[kCoreUnroll];
};

// The turn of tokens [t0, t0 + kCoreUnroll): those below `cached_end` from the cache, zeros for the
// rest (past the context, or a new token that comes from elsewhere: PlaceNewToken).
template <int kDim>
__device__ __forceinline__ CoreTurn LoadTurn(const bf16* k_cache, const bf16* v_cache,
                                             const int32_t* __restrict__ slot_ids, int64_t slot_stride,
                                             int64_t head_offset, int t0, int cached_end) {
  CoreTurn turn;
#pragma unroll
  for (int u = 0; u < kCoreUnroll; ++u) {
    const int t = t0 + u;
    if (t < cached_end) {
      const int64_t base = static_cast<int64_t>(slot_ids[t]) * slot_stride + head_offset;
      turn.k[u] = __ldcs(reinterpret_cast<const uint4*>(k_cache + base));
      turn.v[u] = __ldcs(reinterpret_cast<const uint4*>(v_cache + base));
    } else {
      turn.k[u] = make_uint4(0, 0, 0, 0);
      turn.v[u] = make_uint4(0, 0, 0, 0);
    }
  }
  return turn;
}

// Puts the new token, token hi - 1, into the turn from t0 where it holds it: from `new_k` and
// `new_v` (the lane's 8 dims of its k and v as floats, in shared memory), rounded to bf16 as its
// store into the cache rounds them.
__device__ __forceinline__ void PlaceNewToken(int t0, int hi, const float* new_k, const float* new_v, CoreTurn& turn) {
#pragma unroll
  for (int u = 0; u < kCoreUnroll; ++u) {
    if (t0 + u == hi - 1) {
      turn.k[u] = Pack8(new_k);
      turn.v[u] = Pack8(new_v);
    }
  }
}

// Folds the turn from t0 (its tokens from hi on masked) into a token group's online softmax.
template <int kDim, int kG>
__device__ __forceinline__ void AttendTurn(const float (&qr)[kG][8], const CoreTurn& turn, int t0, int hi,
                                           float (&acc)[kG][8], float (&run_max)[kG], float (&run_sum)[kG]) {
  constexpr int kLanes = kDim / 8;
  float score[kCoreUnroll][kG];
#pragma unroll
  for (int u = 0; u < kCoreUnroll; ++u) {
    float kf[8];
    Unpack8(turn.k[u], kf);
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
    for (int u = 0; u < kCoreUnroll; ++u) m = fmaxf(m, score[u][g]);
    if (m == -INFINITY) continue;  // nothing valid seen yet
    const float correction = exp2f(run_max[g] - m);
    run_sum[g] *= correction;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] *= correction;
    run_max[g] = m;
#pragma unroll
    for (int u = 0; u < kCoreUnroll; ++u) {
      const float p = exp2f(score[u][g] - m);
      run_sum[g] += p;
      float vf[8];
      Unpack8(turn.v[u], vf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
    }
  }
}

// A token group's first kEarly turns over slots [lo, hi) (AttendTokens' turns), loaded from the
// cache ahead of AttendTokens, as a linked launch does before its inputs arrive: every token but
// the new one, hi - 1, which the launch stores itself (AttendTokens places it from the polled copy).
template <int kDim, int kEarly>
__device__ __forceinline__ void LoadEarlyTurns(const bf16* k_cache, const bf16* v_cache,
                                               const int32_t* __restrict__ slot_ids, int64_t slot_stride,
                                               int64_t head_offset, int lo, int hi, int group, int stride_groups,
                                               CoreTurn (&early)[kEarly]) {
#pragma unroll
  for (int i = 0; i < kEarly; ++i) {
    early[i] = LoadTurn<kDim>(k_cache, v_cache, slot_ids, slot_stride, head_offset,
                              lo + (group + i * stride_groups) * kCoreUnroll, hi - 1);
  }
}

// A token group's online softmax over slots [lo, hi): the group takes kCoreUnroll tokens at a time,
// `group` counting from the first group of the token range and `stride_groups` groups sharing it.
// The loop runs while the warp's first group (`warp_first_group`) has tokens, so every lane of a
// warp takes the same trip count (the shuffles need the whole warp); a group past the end masks
// its tokens. With `new_k` and `new_v` (the lane's 8 dims of the new token's k and v as floats,
// in shared memory), token hi - 1 is taken from them (PlaceNewToken) rather than loaded from the
// cache. With kEarly > 0, `early` holds the first kEarly turns (LoadEarlyTurns, with new_k and
// new_v given).
template <int kDim, int kG, int kEarly = 0>
__device__ __forceinline__ void AttendTokens(const float (&qr)[kG][8], const bf16* k_cache, const bf16* v_cache,
                                             const int32_t* __restrict__ slot_ids, int64_t slot_stride,
                                             int64_t head_offset, int lo, int hi, int group, int warp_first_group,
                                             int stride_groups, float (&acc)[kG][8], float (&run_max)[kG],
                                             float (&run_sum)[kG], const float* new_k = nullptr,
                                             const float* new_v = nullptr, CoreTurn* early = nullptr) {
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    run_max[g] = -INFINITY;
    run_sum[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }
  const int cached_end = new_k != nullptr ? hi - 1 : hi;
  int t0 = lo + group * kCoreUnroll, w0 = lo + warp_first_group * kCoreUnroll;
#pragma unroll
  for (int i = 0; i < kEarly; ++i, t0 += stride_groups * kCoreUnroll, w0 += stride_groups * kCoreUnroll) {
    if (w0 >= hi) return;
    PlaceNewToken(t0, hi, new_k, new_v, early[i]);
    AttendTurn<kDim, kG>(qr, early[i], t0, hi, acc, run_max, run_sum);
  }
  for (; w0 < hi; t0 += stride_groups * kCoreUnroll, w0 += stride_groups * kCoreUnroll) {
    CoreTurn turn = LoadTurn<kDim>(k_cache, v_cache, slot_ids, slot_stride, head_offset, t0, cached_end);
    if (new_k != nullptr) PlaceNewToken(t0, hi, new_k, new_v, turn);
    AttendTurn<kDim, kG>(qr, turn, t0, hi, acc, run_max, run_sum);
  }
}

// kCount consecutive floats, in one store when `dst` is aligned for it.
template <int kCount>
__device__ __forceinline__ void StoreShare(float* dst, const float (&v)[kCount]) {
  const bool aligned = (reinterpret_cast<uintptr_t>(dst) % (kCount * sizeof(float))) == 0;
  if constexpr (kCount == 4) {
    if (aligned) {
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
  } else if constexpr (kCount == 2) {
    if (aligned) {
      *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kCount; ++j) dst[j] = v[j];
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_DECODE_CORES_CUH_
