#include "kernels/cuda/sampling.h"

#include <cfloat>

#include "common/cuda/cuda_check.h"
#include "kernels/cuda/random.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr double kFixedOne = 4294967296.0;  // 2^32: probability 1 in 32.32 fixed point

// An unsigned key with the order of the float.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  const uint32_t bits = __float_as_uint(f);
  return bits ^ ((bits >> 31) ? 0xffffffffu : 0x80000000u);
}

// The fixed-point weight of a logit at the temperature, relative to the row's maximum.
__device__ __forceinline__ uint64_t Weight(float logit, float max_logit, float temperature) {
  return static_cast<uint64_t>(exp((static_cast<double>(logit) - max_logit) / temperature) * kFixedOne);
}

// The largest key τ such that the keys ≥ τ (among those ≥ floor) hold at least `target`, counting
// each key as 1 (by_mass false) or as its weight. Four passes of 8 bits, high digits first.
__device__ uint32_t RadixSelect(const float* row, int64_t vocab, uint32_t floor, uint64_t target, bool by_mass,
                                float max_logit, float temperature) {
  __shared__ unsigned long long histogram[256];
  __shared__ uint32_t chosen_prefix;
  __shared__ uint64_t chosen_remaining;
  uint32_t prefix = 0;
  uint64_t remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) histogram[d] = 0;
    __syncthreads();
    const uint64_t high_mask = shift == 24 ? 0 : (0xffffffffull << (shift + 8)) & 0xffffffffull;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const uint32_t key = OrderedKey(row[i]);
      if (key < floor || (key & high_mask) != (prefix & high_mask)) continue;
      const uint64_t w = by_mass ? Weight(row[i], max_logit, temperature) : 1;
      atomicAdd(&histogram[(key >> shift) & 255], static_cast<unsigned long long>(w));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int digit = 0;
      for (int d = 255; d >= 0; --d) {
        if (histogram[d] >= remaining) {
          digit = d;
          break;
        }
        remaining -= histogram[d];
      }
      chosen_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
      chosen_remaining = remaining;
    }
    __syncthreads();
    prefix = chosen_prefix;
    remaining = chosen_remaining;
  }
  return prefix;
}

// Exclusive prefix sum over the block, in thread order.
__device__ uint64_t BlockExclusiveScan(uint64_t v, uint64_t* total) {
  __shared__ uint64_t warp_sums[kWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  uint64_t inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  uint64_t before = 0;
  uint64_t all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  *total = all;
  return before + inclusive - v;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(const float* logits, const int32_t* rows,
                                                         const DeviceSamplingParams* params, int32_t* tokens,
                                                         int64_t vocab) {
  const float* row = logits + (rows ? rows[blockIdx.x] : static_cast<int64_t>(blockIdx.x)) * vocab;
  const DeviceSamplingParams p = params[blockIdx.x];

  // The maximum and, for greedy, its lowest index.
  float best = -INFINITY;
  int64_t best_index = vocab;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (row[i] > best) {
      best = row[i];
      best_index = i;
    }
  }
  __shared__ float shared_best[kWarps];
  __shared__ int64_t shared_index[kWarps];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t other_index = __shfl_xor_sync(0xffffffffu, best_index, o);
    if (other > best || (other == best && other_index < best_index)) {
      best = other;
      best_index = other_index;
    }
  }
  if (threadIdx.x % 32 == 0) {
    shared_best[threadIdx.x / 32] = best;
    shared_index[threadIdx.x / 32] = best_index;
  }
  __syncthreads();
  best = shared_best[0];
  best_index = shared_index[0];
  for (int w = 1; w < kWarps; ++w) {
    if (shared_best[w] > best || (shared_best[w] == best && shared_index[w] < best_index)) {
      best = shared_best[w];
      best_index = shared_index[w];
    }
  }
  if (p.temperature <= 0.f || best_index >= vocab) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = static_cast<int32_t>(best_index < vocab ? best_index : 0);
    return;
  }

  uint32_t threshold = 0;
  if (p.top_k > 0 && p.top_k < vocab) {
    threshold = RadixSelect(row, vocab, 0, static_cast<uint64_t>(p.top_k), false, best, p.temperature);
  }
  if (p.top_p < 1.f) {
    uint64_t mass = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (OrderedKey(row[i]) >= threshold) mass += Weight(row[i], best, p.temperature);
    }
    uint64_t total = 0;
    BlockExclusiveScan(mass, &total);
    const uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(p.top_p) * static_cast<double>(total)));
    threshold = RadixSelect(row, vocab, threshold, target < 1 ? 1 : target, true, best, p.temperature);
  }

  // Each thread owns a contiguous run of ids, so the draw walks the kept tokens in id order.
  const int64_t per_thread = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t lo = threadIdx.x * per_thread;
  const int64_t hi = min(vocab, lo + per_thread);
  uint64_t mine = 0;
  for (int64_t i = lo; i < hi; ++i) {
    if (OrderedKey(row[i]) >= threshold) mine += Weight(row[i], best, p.temperature);
  }
  uint64_t total = 0;
  const uint64_t before = BlockExclusiveScan(mine, &total);
  const uint64_t draw = __umul64hi(SplitMix64(p.seed ^ SplitMix64(p.counter)), total);
  if (draw >= before && draw < before + mine) {
    uint64_t cumulative = before;
    for (int64_t i = lo; i < hi; ++i) {
      if (OrderedKey(row[i]) < threshold) continue;
      cumulative += Weight(row[i], best, p.temperature);
      if (draw < cumulative) {
        tokens[blockIdx.x] = static_cast<int32_t>(i);
        break;
      }
    }
  }
}

}  // namespace

absl::Status Sample(const float* logits, const int32_t* rows, const DeviceSamplingParams* params, int32_t* tokens,
                    int64_t draws, int64_t vocab, cudaStream_t stream) {
  if (draws == 0) return absl::OkStatus();
  SampleKernel<<<static_cast<unsigned>(draws), kThreads, 0, stream>>>(logits, rows, params, tokens, vocab);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
