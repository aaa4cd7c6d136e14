#include "kernels/cuda/sampling.h"

#include <cfloat>
#include <cstdint>
#include <map>
#include <mutex>

#include <cooperative_groups.h>

#include "common/cuda/cuda_check.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/random.cuh"
#include "kernels/cuda/reduce.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Groups of four logits each thread loads before it uses them: one block streams a row, and
// bytes in flight set its rate.
constexpr int kAhead = 4;
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

// Logits read four at a time: group g holds positions 4g .. 4g + 3. Both readers below give the
// same interface to the selection and the draw.
//
// Every reader walks the groups [begin(), end()) and reads group groups() (past the end of the
// row) as nothing valid.
//
// A row of the logits, where a position is the token id, or a slice of it (a block's share when a
// cluster of blocks reads the row). Rows whose length is a multiple of 4 and that start 16-byte
// aligned load a group as one float4.
struct RowReader {
  const float* row;
  int64_t vocab;
  bool vectorized;
  int64_t first_group = 0;
  int64_t end_group = (vocab + 3) / 4;

  __device__ int64_t groups() const { return (vocab + 3) / 4; }
  __device__ int64_t begin() const { return first_group; }
  __device__ int64_t end() const { return end_group; }
  __device__ int64_t Id(int64_t position) const { return position; }
  // The group's logits; positions past the end read as -inf and are left out by `valid`.
  __device__ void Load(int64_t g, float (&v)[4], bool (&valid)[4]) const {
    if (vectorized && g < groups()) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(row) + g);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
#pragma unroll
      for (int j = 0; j < 4; ++j) valid[j] = true;
      return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      valid[j] = 4 * g + j < vocab;
      v[j] = valid[j] ? row[4 * g + j] : -INFINITY;
    }
  }
};

// The candidates gathered into shared memory, in id order: the logits of a band below the row's
// maximum (see SampleKernel) and their ids, 8 bytes each in the launch's dynamic shared memory.
constexpr int kMaxCandidates = 16384;
constexpr size_t kCandidateBytes = kMaxCandidates * (sizeof(float) + sizeof(int32_t));
struct CandidateReader {
  const float* logit;  // [kMaxCandidates], 16-byte aligned
  const int32_t* id;   // [kMaxCandidates]
  int64_t count;

  __device__ int64_t groups() const { return (count + 3) / 4; }
  __device__ int64_t begin() const { return 0; }
  __device__ int64_t end() const { return groups(); }
  __device__ int64_t Id(int64_t position) const { return id[position]; }
  __device__ void Load(int64_t g, float (&v)[4], bool (&valid)[4]) const {
    const float4 f = g < kMaxCandidates / 4 ? reinterpret_cast<const float4*>(logit)[g] : float4{};
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      valid[j] = 4 * g + j < count;
      if (!valid[j]) v[j] = -INFINITY;
    }
  }
};

// Exclusive prefix sum over the warp, in lane order.
template <typename T>
__device__ __forceinline__ T WarpExclusiveScan(T v) {
  const int lane = threadIdx.x % 32;
  T inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  return inclusive - v;
}

// Each warp's share of the groups, a contiguous span, walked 32 groups a step: warps read their
// spans side by side, lane order within a step is position order, and every lane of a warp goes
// round together (so warp-wide calls may be made on the way).
struct WarpSpan {
  int64_t begin, end;
  __device__ WarpSpan(int64_t first, int64_t last) {
    const int64_t span = (last - first + kWarps - 1) / kWarps;
    begin = min(last, first + threadIdx.x / 32 * span);
    end = min(last, begin + span);
  }
};

// Calls visit(g, v, valid) for each of the lane's groups of the warp's span in order (lanes with
// no group in a step get g = reader.groups(), all invalid), loading kAhead steps ahead.
template <typename Reader, typename Visit>
__device__ __forceinline__ void ForEachInSpan(const Reader& reader, Visit&& visit) {
  const WarpSpan span(reader.begin(), reader.end());
  const int lane = threadIdx.x % 32;
  for (int64_t first = span.begin; first < span.end; first += 32 * kAhead) {
    float v[kAhead][4];
    bool valid[kAhead][4];
    int64_t g[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      g[u] = first + 32 * u + lane < span.end ? first + 32 * u + lane : reader.groups();
      reader.Load(g[u], v[u], valid[u]);
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (first + 32 * u < span.end) visit(g[u], v[u], valid[u]);
    }
  }
}

// Adds each lane's `amount` to histogram[digit], one atomic per distinct digit of the warp (the
// top digits of a row's keys are few, and per-lane atomics on them serialise). Every lane of the
// warp calls it; lanes with digit kNoDigit add nothing. `amount` ≤ 2^32 (a weight, or 1).
constexpr uint32_t kNoDigit = 0xffffffffu;
__device__ __forceinline__ void AddToHistogram(unsigned long long* histogram, uint32_t digit, uint64_t amount) {
  const unsigned peers = __match_any_sync(0xffffffffu, digit);
  // Halves of at most 17 bits: 32 of them sum without overflow.
  const unsigned high = __reduce_add_sync(peers, static_cast<unsigned>(amount >> 16));
  const unsigned low = __reduce_add_sync(peers, static_cast<unsigned>(amount & 0xffffu));
  if (digit != kNoDigit && threadIdx.x % 32 == static_cast<unsigned>(__ffs(peers) - 1)) {
    atomicAdd(&histogram[digit], (static_cast<unsigned long long>(high) << 16) + low);
  }
}

// The largest key τ such that the keys ≥ τ (among those ≥ floor) hold at least `target`, counting
// each key as 1 (by_mass false) or as its weight. Four passes of 8 bits, high digits first.
template <typename Reader>
__device__ uint32_t RadixSelect(const Reader& reader, uint32_t floor, uint64_t target, bool by_mass, float max_logit,
                                float temperature) {
  __shared__ unsigned long long histogram[256];
  __shared__ uint32_t chosen_prefix;
  __shared__ uint64_t chosen_remaining;
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0;
  uint64_t remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) histogram[d] = 0;
    __syncthreads();
    const uint32_t high_mask = shift == 24 ? 0 : static_cast<uint32_t>((0xffffffffull << (shift + 8)) & 0xffffffffull);
    ForEachInSpan(reader, [&](int64_t, const float(&v)[4], const bool(&valid)[4]) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t key = OrderedKey(v[j]);
        const bool counted = valid[j] && key >= floor && (key & high_mask) == (prefix & high_mask);
        if (!__any_sync(0xffffffffu, counted)) continue;
        const uint64_t amount = !counted ? 0 : by_mass ? Weight(v[j], max_logit, temperature) : 1;
        AddToHistogram(histogram, counted ? (key >> shift) & 255 : kNoDigit, amount);
      }
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // The digit where the count from the top reaches `remaining`: lane L holds digits
      // 255 - 8L down to 248 - 8L, and the lane whose share reaches it walks its eight.
      const int top = 255 - 8 * lane;
      uint64_t bins[8], share = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) share += bins[i] = histogram[top - i];
      const uint64_t higher = WarpExclusiveScan(share);
      const uint64_t all = __shfl_sync(0xffffffffu, higher + share, 31);
      if (remaining > higher && remaining <= higher + share) {
        uint64_t left = remaining - higher;
        int digit = top;
        for (int i = 0; i < 8; ++i, --digit) {
          if (bins[i] >= left) break;
          left -= bins[i];
        }
        chosen_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        chosen_remaining = left;
      } else if (lane == 31 && remaining > all) {  // short of the target: the lowest digit
        chosen_prefix = prefix;
        chosen_remaining = remaining - all;
      }
    }
    __syncthreads();
    prefix = chosen_prefix;
    remaining = chosen_remaining;
  }
  return prefix;
}

// The mass of the keys ≥ threshold among a group's logits.
__device__ __forceinline__ uint64_t GroupMass(const float (&v)[4], const bool (&valid)[4], uint32_t threshold,
                                              float max_logit, float temperature) {
  uint64_t mass = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (valid[j] && OrderedKey(v[j]) >= threshold) mass += Weight(v[j], max_logit, temperature);
  }
  return mass;
}

// The mass of the keys ≥ threshold over the reader, to every thread.
template <typename Reader>
__device__ uint64_t MassAtLeast(const Reader& reader, uint32_t threshold, float max_logit, float temperature) {
  uint64_t mass = 0;
  ForEachInSpan(reader, [&](int64_t, const float(&v)[4], const bool(&valid)[4]) {
    mass += GroupMass(v, valid, threshold, max_logit, temperature);
  });
  return BlockSum(mass);
}

// The token of the draw: the position whose cumulative mass, over the keys ≥ threshold in
// position order, first exceeds the draw (SampleToken's walk). `row_mass`, when the top-p
// threshold is to be found with neither a top-k nor a min-p one, is the mass of the whole row (the
// reader may hold only part of it). The reader holds every key the thresholds keep.
template <typename Reader>
__device__ int64_t SelectAndDraw(const Reader& reader, const DeviceSamplingParams& p, int64_t vocab, float best,
                                 int64_t best_index, uint64_t row_mass) {
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool min_p = p.min_p_offset > -INFINITY;
  // Every key >= threshold is kept: min_p's floor, then the k-th largest key if higher.
  uint32_t threshold = min_p ? OrderedKey(best + p.min_p_offset) : 0;
  if (top_k) {
    threshold = max(threshold, RadixSelect(reader, 0, static_cast<uint64_t>(p.top_k), false, best, p.temperature));
  }
  if (p.top_p < 1.f) {
    const uint64_t total = top_k || min_p ? MassAtLeast(reader, threshold, best, p.temperature) : row_mass;
    const uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(p.top_p) * static_cast<double>(total)));
    threshold = RadixSelect(reader, threshold, target < 1 ? 1 : target, true, best, p.temperature);
  }

  // The warps' masses place the draw in one span, whose warp walks it again.
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  uint64_t mass = 0;
  ForEachInSpan(reader, [&](int64_t, const float(&v)[4], const bool(&valid)[4]) {
    mass += GroupMass(v, valid, threshold, best, p.temperature);
  });
  mass = WarpSum(mass);
  __shared__ uint64_t warp_mass[kWarps];
  __shared__ int64_t chosen;
  if (lane == 0) warp_mass[warp] = mass;
  if (threadIdx.x == 0) chosen = best_index;  // the draw always lands; this only guards
  __syncthreads();
  uint64_t before = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_mass[w];
    total += warp_mass[w];
  }
  const uint64_t draw = __umul64hi(SplitMix64(p.seed ^ SplitMix64(p.counter)), total);
  if (draw >= before && draw < before + mass) {  // the same for the whole warp
    ForEachInSpan(reader, [&](int64_t g, const float(&v)[4], const bool(&valid)[4]) {
      const uint64_t group_mass = GroupMass(v, valid, threshold, best, p.temperature);
      const uint64_t lane_before = before + WarpExclusiveScan(group_mass);
      if (draw >= lane_before && draw < lane_before + group_mass) {
        uint64_t cumulative = lane_before;
        for (int j = 0; j < 4; ++j) {
          if (!valid[j] || OrderedKey(v[j]) < threshold) continue;
          cumulative += Weight(v[j], best, p.temperature);
          if (draw < cumulative) {
            chosen = reader.Id(4 * g + j);
            break;
          }
        }
      }
      before += WarpSum(group_mass);
    });
  }
  __syncthreads();
  const int64_t token = chosen;
  __syncthreads();  // `chosen` may be set again by a later call
  return token;
}

// Bands below the row's maximum, each twice as wide as the one before: logits within
// BandWidth(b) of the maximum (times the temperature where top-p alone decides), of which the
// narrowest that holds what the selection needs, and no more than kMaxCandidates, is gathered.
constexpr int kBands = 8;
__device__ __forceinline__ float BandWidth(int b) { return 0.125f * static_cast<float>(1 << b); }

// The narrowest band holding `v`, which must be ≥ floor[kBands - 1]: floors fall as bands widen,
// so this is the first band whose floor `v` reaches (a binary search).
__device__ __forceinline__ int NarrowestBand(float v, const float* floor) {
  static_assert(kBands == 8, "three halvings find the band");
  int band = 0;
  if (v < floor[band + 3]) band += 4;
  if (v < floor[band + 1]) band += 2;
  if (v < floor[band]) band += 1;
  return band;
}

// Each band's count over the row, per warp (warp spans), and for top-p alone the band's masses
// and the row's, to every thread: one pass over the row. `floor` is in shared memory.
template <bool kWithMass>
__device__ void CountBands(const RowReader& reader, const float* floor, float best, float temperature,
                           uint32_t (*warp_count)[kBands], uint64_t* band_mass, uint64_t* row_mass) {
  // Counts of the narrowest band, 16 bits each (a thread sees far fewer than 2^16 logits):
  // bands 0-3 in narrow_low, 4-7 in narrow_high.
  uint64_t narrow_low = 0, narrow_high = 0;
  uint64_t mass[kWithMass ? kBands : 1] = {};
  uint64_t all = 0;
  ForEachInSpan(reader, [&](int64_t, const float(&v)[4], const bool(&valid)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (!valid[j]) continue;
      uint64_t w = 0;
      if (kWithMass) {
        // exp(-23) · 2^32 < 1: such a logit weighs 0 and its exp is skipped.
        if ((static_cast<double>(v[j]) - best) / temperature > -23.0) w = Weight(v[j], best, temperature);
        all += w;
      }
      if (!(v[j] >= floor[kBands - 1])) continue;  // outside every band (or NaN)
      const int band = NarrowestBand(v[j], floor);
      const uint64_t one = uint64_t{1} << (16 * (band % 4));
      if (band < 4) {
        narrow_low += one;
      } else {
        narrow_high += one;
      }
      if (kWithMass) {
#pragma unroll
        for (int b = 0; b < kBands; ++b) mass[b] += b == band ? w : 0;
      }
    }
  });
  // A band holds the logits of its own and every narrower band.
  const int lane = threadIdx.x % 32;
  uint32_t count = 0;
  uint64_t band_total = 0;
#pragma unroll
  for (int b = 0; b < kBands; ++b) {
    count += WarpSum(static_cast<uint32_t>(((b < 4 ? narrow_low : narrow_high) >> (16 * (b % 4))) & 0xffffu));
    if (lane == 0) warp_count[threadIdx.x / 32][b] = count;
    if (kWithMass) band_mass[b] = band_total += BlockSum(mass[b]);
  }
  if (kWithMass) *row_mass = BlockSum(all);
}

// Gathers the reader's logits ≥ floor, in id order, from logit[first] and id[first] on, given each
// warp's count of them (warp spans). The arrays may be another block's of the cluster.
__device__ void GatherBand(const RowReader& reader, float floor, const uint32_t (*warp_count)[kBands], int band,
                           uint32_t first, float* logit, int32_t* id) {
  const int warp = threadIdx.x / 32;
  uint32_t next = first;
  for (int w = 0; w < warp; ++w) next += warp_count[w][band];
  ForEachInSpan(reader, [&](int64_t g, const float(&v)[4], const bool(&valid)[4]) {
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) mine += valid[j] && v[j] >= floor;
    if (!__any_sync(0xffffffffu, mine != 0)) return;  // most steps: nothing to gather
    uint32_t at = next + WarpExclusiveScan(mine);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (valid[j] && v[j] >= floor) {
        logit[at] = v[j];
        id[at] = static_cast<int32_t>(4 * g + j);
        ++at;
      }
    }
    next += WarpSum(mine);
  });
}

// What a block of a row's cluster tells the others, in its shared memory.
struct BlockShare {
  float best;
  int64_t best_index;
  uint32_t band_count[kBands];  // the logits of its slice in each band
  uint64_t band_mass[kBands];   // top-p alone: their masses
  uint64_t row_mass;            // top-p alone: its slice's
};

// One cluster of blocks per draw (cluster.num_blocks() of them, one when the launch has as many
// draws as SMs). Each block reads its slice of the row: for the maximum, for the bands' counts,
// and for the gather, whose logits go straight into the first block's shared memory. The first
// block then selects and draws alone. Integer counts and fixed-point masses add up exactly, so
// the draw is the same whatever the cluster size.
__global__ void __launch_bounds__(kThreads) SampleKernel(const float* logits, const int32_t* rows,
                                                         const DeviceSamplingParams* params, int32_t* tokens,
                                                         int64_t vocab) {
  StartChained();
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const unsigned cluster_blocks = cluster.num_blocks();
  const int64_t draw = blockIdx.x / cluster_blocks;
  const float* row = logits + (rows ? rows[draw] : draw) * vocab;
  const RowReader whole{row, vocab, vocab % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0};
  const int64_t slice = (whole.groups() + cluster_blocks - 1) / cluster_blocks;
  RowReader reader = whole;
  reader.first_group = min(whole.groups(), rank * slice);
  reader.end_group = min(whole.groups(), reader.first_group + slice);
  const DeviceSamplingParams p = params[draw];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  __shared__ BlockShare share;

  // The maximum and, for greedy, its lowest index. A lane's ids rise, so `>` keeps its lowest.
  float best = -INFINITY;
  int64_t best_index = vocab;
  ForEachInSpan(reader, [&](int64_t g, const float(&v)[4], const bool(&valid)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (valid[j] && v[j] > best) {
        best = v[j];
        best_index = 4 * g + j;
      }
    }
  });
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
  if (lane == 0) {
    shared_best[warp] = best;
    shared_index[warp] = best_index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    best = shared_best[0];
    best_index = shared_index[0];
    for (int w = 1; w < kWarps; ++w) {
      if (shared_best[w] > best || (shared_best[w] == best && shared_index[w] < best_index)) {
        best = shared_best[w];
        best_index = shared_index[w];
      }
    }
    share.best = best;
    share.best_index = best_index;
  }
  cluster.sync();
  best = -INFINITY;
  best_index = vocab;
  for (unsigned b = 0; b < cluster_blocks; ++b) {
    const BlockShare* other = cluster.map_shared_rank(&share, b);
    if (other->best > best || (other->best == best && other->best_index < best_index)) {
      best = other->best;
      best_index = other->best_index;
    }
  }
  if (p.temperature <= 0.f || best_index >= vocab) {
    if (rank == 0 && threadIdx.x == 0) tokens[draw] = static_cast<int32_t>(best_index < vocab ? best_index : 0);
    cluster.sync();  // no block leaves while another may read its share
    return;
  }

  // Everything the draw can keep lies within some band below the maximum: the top_k largest
  // logits; else those min_p keeps (the top-p share is then of their mass, so the band holds them
  // all); else (top-p alone) the largest ones that hold the top-p share of the row's mass. When a
  // band narrow enough to gather holds that, the selection and the draw run on it in shared
  // memory; otherwise over the whole row.
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool min_p = !top_k && p.min_p_offset > -INFINITY;
  const bool top_p_alone = !top_k && !min_p && p.top_p < 1.f;
  __shared__ float floor[kBands];
  if (threadIdx.x < kBands) floor[threadIdx.x] = best - BandWidth(threadIdx.x) * (top_p_alone ? p.temperature : 1.f);
  __syncthreads();
  __shared__ uint32_t warp_count[kWarps][kBands];
  uint64_t band_mass[kBands] = {}, row_mass = 0;  // top-p alone
  if (top_p_alone) {
    CountBands<true>(reader, floor, best, p.temperature, warp_count, band_mass, &row_mass);
  } else if (top_k || min_p) {
    CountBands<false>(reader, floor, best, p.temperature, warp_count, nullptr, nullptr);
  }
  __syncthreads();
  if (threadIdx.x < kBands) {
    const int b = threadIdx.x;
    uint32_t count = 0;
    for (int w = 0; w < kWarps; ++w) count += warp_count[w][b];
    share.band_count[b] = count;
    share.band_mass[b] = band_mass[b];
  }
  if (threadIdx.x == 0) share.row_mass = row_mass;
  cluster.sync();
  // The row's totals, and the counts of the blocks before this one (where its gather starts).
  uint64_t band_count[kBands] = {};
  uint32_t counted_before[kBands] = {};
  row_mass = 0;
#pragma unroll
  for (int b = 0; b < kBands; ++b) band_mass[b] = 0;
  for (unsigned r = 0; r < cluster_blocks; ++r) {
    const BlockShare* other = cluster.map_shared_rank(&share, r);
#pragma unroll
    for (int b = 0; b < kBands; ++b) {
      band_count[b] += other->band_count[b];
      if (r < rank) counted_before[b] += other->band_count[b];
      band_mass[b] += other->band_mass[b];
    }
    row_mass += other->row_mass;
  }
  int band = -1;
  if (top_k || min_p || top_p_alone) {
    const uint64_t target =
        top_p_alone ? static_cast<uint64_t>(ceil(static_cast<double>(p.top_p) * static_cast<double>(row_mass))) : 0;
    const float min_p_floor = best + p.min_p_offset;
    for (int b = 0; b < kBands && band < 0; ++b) {
      if (band_count[b] > kMaxCandidates) break;
      const bool holds = top_k   ? band_count[b] >= static_cast<uint64_t>(p.top_k)
                         : min_p ? floor[b] <= min_p_floor
                                 : band_mass[b] >= target;
      if (holds) band = b;
    }
  }
  extern __shared__ __align__(16) unsigned char candidate_bytes[];  // kCandidateBytes, the first block's used
  float* candidate_logit = reinterpret_cast<float*>(candidate_bytes);
  int32_t* candidate_id = reinterpret_cast<int32_t*>(candidate_bytes + kMaxCandidates * sizeof(float));
  if (band >= 0) {
    GatherBand(reader, floor[band], warp_count, band, counted_before[band],
               cluster.map_shared_rank(candidate_logit, 0), cluster.map_shared_rank(candidate_id, 0));
  }
  // The gathers have landed, and no block reads another's share after this.
  cluster.sync();
  if (rank != 0) return;
  int64_t token;
  if (band >= 0) {
    const CandidateReader candidates{candidate_logit, candidate_id, static_cast<int64_t>(band_count[band])};
    token = SelectAndDraw(candidates, p, vocab, best, best_index, row_mass);
  } else {
    token = SelectAndDraw(whole, p, vocab, best, best_index, row_mass);
  }
  if (threadIdx.x == 0) tokens[draw] = static_cast<int32_t>(token);
}

// The largest cluster, of 8, 4, 2 or 1 blocks, that fits on `device` (a GPU partition may have
// too few SMs in a group for 8 blocks of this kernel's shared memory); asked once per device.
// SampleKernel's shared memory limit must be set first.
unsigned LargestCluster(int device) {
  static std::mutex mutex;
  static std::map<int, unsigned> largest;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = largest.find(device);
  if (it != largest.end()) return it->second;
  unsigned blocks = 8;
  for (; blocks > 1; blocks /= 2) {
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = blocks;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kCandidateBytes;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, SampleKernel, &config) == cudaSuccess && clusters > 0) break;
    cudaGetLastError();  // a size this GPU cannot take is not an error of the launch
  }
  largest[device] = blocks;
  return blocks;
}

}  // namespace

absl::Status Sample(const float* logits, const int32_t* rows, const DeviceSamplingParams* params, int32_t* tokens,
                    int64_t draws, int64_t vocab, cudaStream_t stream) {
  if (draws == 0) return absl::OkStatus();
  // Past the default 48 KiB of shared memory a launch may take (set for the current device).
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(SampleKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kCandidateBytes)));
  // A cluster of blocks per draw while the draws leave SMs idle: 8 (the most a launch may ask for
  // anywhere), 4 or 2 blocks, or one.
  int device = 0, sms = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  unsigned cluster_blocks = LargestCluster(device);
  while (cluster_blocks > 1 && cluster_blocks * draws > static_cast<unsigned>(sms)) cluster_blocks /= 2;
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChainedInClusters(SampleKernel,
                                                      dim3(static_cast<unsigned>(draws * cluster_blocks)),
                                                      dim3(kThreads), kCandidateBytes, cluster_blocks, stream, logits,
                                                      rows, params, tokens, vocab));
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
