#include "kernels/cuda/logprobs.h"

#include <climits>
#include <cstdint>

#include "common/cuda/cuda_check.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int32_t kNone = INT_MAX;  // the id of an empty entry, ranked after every real one

// Whether (value a, id ia) ranks before (b, ib): larger first, the lower id among equals.
__device__ __forceinline__ bool RanksBefore(float a, int32_t ia, float b, int32_t ib) {
  return a > b || (a == b && ia < ib);
}

// The best-ranked (value, id) over the warp, returned to every lane.
__device__ __forceinline__ void WarpBest(float* value, int32_t* id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, *value, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, *id, o);
    if (RanksBefore(v, i, *value, *id)) {
      *value = v;
      *id = i;
    }
  }
}

// A thread's best kMax (value, id), in rank order, in registers (every index is known at compile
// time). Insert sinks a new entry into place; the last falls off.
struct TopList {
  static constexpr int kMax = kMaxDeviceTopLogprobs;
  float values[kMax];
  int32_t ids[kMax];

  __device__ __forceinline__ void Clear() {
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      values[j] = -INFINITY;
      ids[j] = kNone;
    }
  }
  __device__ __forceinline__ bool Keeps(float v, int32_t id) const {
    return RanksBefore(v, id, values[kMax - 1], ids[kMax - 1]);
  }
  __device__ __forceinline__ void Insert(float v, int32_t id) {
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      if (RanksBefore(v, id, values[j], ids[j])) {
        const float tv = values[j];
        const int32_t ti = ids[j];
        values[j] = v;
        ids[j] = id;
        v = tv;
        id = ti;
      }
    }
  }
  __device__ __forceinline__ void PopFront() {
#pragma unroll
    for (int j = 0; j + 1 < kMax; ++j) {
      values[j] = values[j + 1];
      ids[j] = ids[j + 1];
    }
    values[kMax - 1] = -INFINITY;
    ids[kMax - 1] = kNone;
  }
};

// f(logit, id) for the four logits of group g.
template <typename F>
__device__ __forceinline__ void EachOfGroup(const float4& v, int64_t g, F& f) {
  const int32_t id = static_cast<int32_t>(4 * g);
  f(v.x, id);
  f(v.y, id + 1);
  f(v.z, id + 2);
  f(v.w, id + 3);
}

// Calls f(logit, id) for each logit of `row`, each thread for its share, with kAhead loads in
// flight before any is used: a block alone on its SM is bound by how many bytes it has in flight,
// not by its arithmetic. A row of a multiple of 4 logits (aligned to 16 bytes) is read four
// logits a load.
template <typename F>
__device__ __forceinline__ void ForEachLogit(const float* row, int64_t vocab, F f) {
  constexpr int kAhead = 4;
  if (vocab % 4 == 0) {
    const float4* groups = reinterpret_cast<const float4*>(row);
    const int64_t count = vocab / 4;
    int64_t g = threadIdx.x;
    for (; g + (kAhead - 1) * kThreads < count; g += kAhead * kThreads) {
      float4 v[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) v[u] = groups[g + u * kThreads];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) EachOfGroup(v[u], g + u * kThreads, f);
    }
    for (; g < count; g += kThreads) EachOfGroup(groups[g], g, f);
    return;
  }
  int64_t i = threadIdx.x;
  for (; i + (kAhead - 1) * kThreads < vocab; i += kAhead * kThreads) {
    float v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = row[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) f(v[u], static_cast<int32_t>(i + u * kThreads));
  }
  for (; i < vocab; i += kThreads) f(row[i], static_cast<int32_t>(i));
}

// Shared memory for BlockTop: each warp's best, then the block's.
struct TopScratch {
  float warp_values[kWarps][TopList::kMax];
  int32_t warp_ids[kWarps][TopList::kMax];
  float values[TopList::kMax];
  int32_t ids[TopList::kMax];
};

// The block's best `n` (1 <= n <= kMax) of the entries its threads keep, into scratch->values and
// ->ids in rank order (entries past what the threads hold stay empty: -inf, kNone). Each warp takes
// the best n of its lanes' lists in n rounds (the lane holding a round's winner moving on), then
// warp 0 the best n of the warps' lists the same way. Every thread must call it; `kept` is used up.
__device__ void BlockTop(TopList& kept, int32_t n, TopScratch* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int32_t r = 0; r < n; ++r) {
    float value = kept.values[0];
    int32_t id = kept.ids[0];
    WarpBest(&value, &id);
    if (kept.ids[0] == id) kept.PopFront();
    if (lane == 0) {
      scratch->warp_values[warp][r] = value;
      scratch->warp_ids[warp][r] = id;
    }
  }
  __syncthreads();
  if (warp == 0) {
    int32_t head = 0;  // lane l < kWarps takes warp l's list
    for (int32_t r = 0; r < n; ++r) {
      const bool has = lane < kWarps && head < n;
      float value = has ? scratch->warp_values[lane][head] : -INFINITY;
      int32_t id = has ? scratch->warp_ids[lane][head] : kNone;
      WarpBest(&value, &id);
      if (has && scratch->warp_ids[lane][head] == id) ++head;
      if (lane == 0) {
        scratch->values[r] = value;
        scratch->ids[r] = id;
      }
    }
  }
  __syncthreads();
}

// One block per draw, two passes over its row (the second from L2).
//  1. The row's maximum, and each thread's own. Every one of the `top` most likely tokens is at
//     least the top-th largest of the threads' maxima (that many logits reach it), which the
//     block finds among the maxima alone.
//  2. The sum behind the softmax (float exponentials, accumulated in double), and the logits that
//     reach that threshold, kept in each thread's TopList: few, so that lanes seldom part ways.
// Then BlockTop ranks what the threads kept.
__global__ void __launch_bounds__(kThreads)
    LogprobsKernel(const float* logits, const int32_t* rows, const int32_t* tokens, const int32_t* tops,
                   DeviceTokenLogprobs* out, int64_t vocab) {
  __shared__ TopScratch scratch;
  StartChained();
  const int64_t draw = blockIdx.x;
  if (tops[draw] < 0) return;  // the same for the whole block
  const int32_t top = static_cast<int32_t>(tops[draw] < vocab ? tops[draw] : vocab);
  const float* row = logits + (rows != nullptr ? rows[draw] : draw) * vocab;

  float thread_max = -INFINITY;
  ForEachLogit(row, vocab, [&](float v, int32_t) { thread_max = fmaxf(thread_max, v); });
  const float max_logit = BlockMax(thread_max);
  TopList kept;
  kept.Clear();
  float threshold = INFINITY;  // nothing is kept when no alternative is asked for
  if (top > 0) {
    kept.Insert(thread_max, static_cast<int32_t>(threadIdx.x));
    BlockTop(kept, top, &scratch);
    threshold = scratch.values[top - 1];
    kept.Clear();
  }

  double sum = 0.0;
  const float shift = max_logit > -INFINITY ? max_logit : 0.0f;  // a row of -inf sums to 0
  ForEachLogit(row, vocab, [&](float v, int32_t id) {
    sum += expf(v - shift);
    if (v >= threshold && kept.Keeps(v, id)) kept.Insert(v, id);
  });
  sum = BlockSum(sum);
  const double log_total = max_logit + log(sum);

  DeviceTokenLogprobs& o = out[draw];
  if (top > 0) {
    BlockTop(kept, top, &scratch);
    if (threadIdx.x < top) {
      o.top_ids[threadIdx.x] = scratch.ids[threadIdx.x];
      o.top_logprobs[threadIdx.x] = static_cast<float>(scratch.values[threadIdx.x] - log_total);
    }
  }
  if (threadIdx.x == 0) {
    o.logprob = static_cast<float>(row[tokens[draw]] - log_total);
    o.top_count = top;
  }
}

}  // namespace

absl::Status Logprobs(const float* logits, const int32_t* rows, const int32_t* tokens, const int32_t* tops,
                      DeviceTokenLogprobs* out, int64_t draws, int64_t vocab, cudaStream_t stream) {
  if (draws == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(LogprobsKernel, dim3(static_cast<unsigned>(draws)), dim3(kThreads), 0,
                                            stream, logits, rows, tokens, tops, out, vocab));
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
