// Decode attention over one context chunk of one (sequence, kv head) by a block of 128 threads, on
// the tensor cores, with the KV cache streamed through shared memory.
//
// The block copies the chunk's k and v rows in tiles of kTileTokens tokens with cp.async, gathering
// each token's rows from its slot; kStages tiles share the block's shared memory, so while it
// attends one, the next ones are in flight. The slot ids travel the same way, a few tiles ahead of
// their rows, so that no turn waits on a global load. Each of the 4 warps attends 16 tokens of a
// tile:
//  - S = Q·Kᵀ as mma m16n8k16 products: the kv head's kG query heads are the rows of A (rows kG..15
//    zero), 16 tokens two n-tiles of B, read from shared memory with ldmatrix;
//  - an online softmax on S, rows of 4 lanes each;
//  - Oᵀ += Vᵀ·Pᵀ as products again, V transposed on its way out of shared memory, the heads the n of
//    the product, so that no accumulator holds padding.
// Queries and probabilities are split into two bf16 parts (SplitBf16), so that the products keep
// about 16 bits of them, as float32 arithmetic on the same bf16 cache would, within the CPU
// kernel's tolerances. Kept per warp: the running max and sum of each head, and its outputs.
#ifndef LAMINA_KERNELS_CUDA_DECODE_TILES_CUH_
#define LAMINA_KERNELS_CUDA_DECODE_TILES_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace lamina::kernels::cuda {

constexpr int kTileThreads = 128;
constexpr int kTileWarps = kTileThreads / 32;
constexpr int kTileTokens = 16 * kTileWarps;  // 16 a warp: the k of one P·V product
// The two depths of the pipeline (tests/bench/RESULTS.md has the measurements behind them):
//  - shallow, two tiles: a block attends one while the next is in flight, and two blocks share an
//    SM; the fastest once the blocks of a launch outnumber the SMs (three tiles read slower);
//  - deep, four tiles (three in flight), a block alone on its SM: the fastest with at most a block
//    an SM, where the shallow one has too little in flight.
constexpr int kShallowTileStages = 2;
constexpr int kDeepTileStages = 4;

// A stage holds a tile's k rows, then its v rows, each padded by 16 bytes so that the 8 rows an
// ldmatrix reads start in different banks.
// After the stages, a ring of the slot ids of kStages tiles, copied there ahead of their tiles.
template <int kDim, int kStages>
struct TileLayout {
  static constexpr int kRowBytes = kDim * 2 + 16;
  static constexpr int kStageBytes = 2 * kTileTokens * kRowBytes;
  static constexpr int kSlotRingOffset = kStages * kStageBytes;
  static constexpr int kBytes = kSlotRingOffset + kStages * kTileTokens * 4;  // the least a block needs
};

// What a warp keeps of its tokens: for query head lane / 4 (valid below kG), the running max (log2
// units) and this lane's share of the running sum (the head's 4 lanes add theirs up at the end);
// and the unnormalized outputs, transposed (dims by heads), as the C fragments of 16 dims each:
// o[m][0..1] = dim 16m + lane / 4 of heads 2 (lane % 4) and 2 (lane % 4) + 1, o[m][2..3] the
// same 8 dims on.
template <int kDim>
struct WarpRows {
  float max = -INFINITY;
  float sum = 0.f;
  float o[kDim / 16][4] = {};
};

// The A fragments of Q for each 16 dims, scaled and split: row lane / 4 is query head
// `first_head` + lane / 4 (zero past kG), `load(i)` gives float i of the block's kG * kDim query
// floats.
template <int kDim, int kG, typename Load>
__device__ __forceinline__ void QueryFragments(const Load& load, float scale, uint32_t (&high)[kDim / 16][2],
                                               uint32_t (&low)[kDim / 16][2]) {
  const int lane = threadIdx.x % 32;
  const int row = lane / 4, col = 2 * (lane % 4);
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int d = 16 * ks + 8 * half + col;
      const float x0 = row < kG ? load(row * kDim + d) * scale : 0.f;
      const float x1 = row < kG ? load(row * kDim + d + 1) * scale : 0.f;
      SplitBf16(x0, x1, high[ks][half], low[ks][half]);
    }
  }
}

namespace tiles_internal {

// Copies tile `tile` of the chunk [lo, hi) into its stage. `slots` are the slot ids of this
// thread's rows of it (-1 past hi): row first_row + j * kRowsPerPass takes slots[j].
template <int kDim, int kStages>
__device__ __forceinline__ void CopyTile(uint32_t smem, int tile, const int* slots, const __nv_bfloat16* k_cache,
                                         const __nv_bfloat16* v_cache, int64_t slot_stride, int64_t head_offset) {
  using Layout = TileLayout<kDim, kStages>;
  constexpr int kPieces = kDim / 8;  // 16-byte pieces of a row
  constexpr int kRowsPerPass = kTileThreads / kPieces;
  const int piece = threadIdx.x % kPieces, first_row = threadIdx.x / kPieces;
  const uint32_t stage = smem + (tile % kStages) * Layout::kStageBytes + piece * 16;
#pragma unroll
  for (int j = 0; j < kTileTokens / kRowsPerPass; ++j) {
    const int row = first_row + j * kRowsPerPass;
    const bool valid = slots[j] >= 0;
    const int64_t at = valid ? slots[j] * slot_stride + head_offset + piece * 8 : 0;
    CopyAsync16(stage + row * Layout::kRowBytes, k_cache + at, valid);
    CopyAsync16(stage + (kTileTokens + row) * Layout::kRowBytes, v_cache + at, valid);
  }
}

// The slot ids of this thread's rows of tile `tile` (CopyTile's `slots`), from global memory.
template <int kDim>
__device__ __forceinline__ void LoadTileSlots(const int32_t* slot_ids, int lo, int hi, int tile, int* slots) {
  constexpr int kRowsPerPass = kTileThreads / (kDim / 8);
  const int first = lo + tile * kTileTokens + threadIdx.x / (kDim / 8);
#pragma unroll
  for (int j = 0; j < kTileTokens / kRowsPerPass; ++j) {
    const int t = first + j * kRowsPerPass;
    slots[j] = t < hi ? __ldg(slot_ids + t) : -1;
  }
}

// The same from the ring, where CopyTileSlots put them.
template <int kDim, int kStages>
__device__ __forceinline__ void ReadTileSlots(const unsigned char* smem, int lo, int hi, int tile, int* slots) {
  constexpr int kRowsPerPass = kTileThreads / (kDim / 8);
  const int32_t* ring = reinterpret_cast<const int32_t*>(smem + TileLayout<kDim, kStages>::kSlotRingOffset) +
                        (tile % kStages) * kTileTokens;
  const int first_row = threadIdx.x / (kDim / 8);
#pragma unroll
  for (int j = 0; j < kTileTokens / kRowsPerPass; ++j) {
    const int row = first_row + j * kRowsPerPass;
    slots[j] = lo + tile * kTileTokens + row < hi ? ring[row] : -1;
  }
}

// Queues the copy of tile `tile`'s slot ids into the ring (zeros past hi), one 4-byte copy a token.
template <int kDim, int kStages>
__device__ __forceinline__ void CopyTileSlots(unsigned char* smem, const int32_t* slot_ids, int lo, int hi, int tile) {
  if (threadIdx.x >= kTileTokens) return;
  const int t = lo + tile * kTileTokens + threadIdx.x;
  const uint32_t to = SharedAddress(smem + TileLayout<kDim, kStages>::kSlotRingOffset) +
                      ((tile % kStages) * kTileTokens + threadIdx.x) * 4;
  CopyAsync4(to, t < hi ? slot_ids + t : slot_ids, t < hi);
}

// The warp's 16 tokens of the tile in `stage` (shared address), the first of them at chunk token
// `first`; tokens from `hi` on are masked.
template <int kDim>
__device__ __forceinline__ void AttendWarpTokens(const uint32_t (&q_high)[kDim / 16][2],
                                                 const uint32_t (&q_low)[kDim / 16][2], uint32_t stage, int first,
                                                 int hi, WarpRows<kDim>& rows) {
  using Layout = TileLayout<kDim, kShallowTileStages>;  // only its row size, the same at every depth
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int m = lane / 8, r = lane % 8;  // this lane addresses row r of 8 x 8 matrix m
  const uint32_t k_rows = stage + 16 * warp * Layout::kRowBytes;
  const uint32_t v_rows = k_rows + kTileTokens * Layout::kRowBytes;

  // S = Q·Kᵀ, tokens 8j..8j+7 in s[j]; the two parts of Q in their own sums (shorter chains).
  // Matrices: tokens 0-7 and 8-15 (m / 2) by dims +0 and +8 (m % 2).
  float s_high[2][4] = {}, s_low[2][4] = {};
  const uint32_t k_at = k_rows + ((m / 2) * 8 + r) * Layout::kRowBytes + (m % 2) * 16;
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
    uint32_t b[4];
    LoadMatrices(k_at + ks * 32, b);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      MmaUpperRows(s_high[j], q_high[ks][0], q_high[ks][1], b[2 * j], b[2 * j + 1]);
      MmaUpperRows(s_low[j], q_low[ks][0], q_low[ks][1], b[2 * j], b[2 * j + 1]);
    }
  }
  float s[2][2];
  float tile_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = first + 8 * j + 2 * (lane % 4) + e;
      s[j][e] = t < hi ? s_high[j][e] + s_low[j][e] : -INFINITY;
      tile_max = fmaxf(tile_max, s[j][e]);
    }
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  // The caller's `first` < hi, so every row has a finite score here.
  const float new_max = fmaxf(rows.max, tile_max);
  const float correction = exp2f(rows.max - new_max);
  rows.max = new_max;
  float p[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) p[j][e] = exp2f(s[j][e] - new_max);
  }
  rows.sum = rows.sum * correction + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
  // The outputs' columns are heads 2 (lane % 4) and the next, whose corrections lanes 8 (lane % 4)
  // and 8 (lane % 4) + 4 hold.
  const float correction_even = __shfl_sync(0xffffffffu, correction, 8 * (lane % 4));
  const float correction_odd = __shfl_sync(0xffffffffu, correction, 8 * (lane % 4) + 4);
#pragma unroll
  for (int d = 0; d < kDim / 16; ++d) {
    rows.o[d][0] *= correction_even;
    rows.o[d][1] *= correction_odd;
    rows.o[d][2] *= correction_even;
    rows.o[d][3] *= correction_odd;
  }

  // Oᵀ += Vᵀ·Pᵀ: Pᵀ's B fragment is S's layout (tokens 2c.. of n-tile 0, then of n-tile 1), and Vᵀ
  // comes out of shared memory transposed, 16 dims an A fragment, from the same matrices as K's.
  uint32_t p_high[2], p_low[2];
  SplitBf16(p[0][0], p[0][1], p_high[0], p_low[0]);
  SplitBf16(p[1][0], p[1][1], p_high[1], p_low[1]);
  const uint32_t v_at = v_rows + ((m / 2) * 8 + r) * Layout::kRowBytes + (m % 2) * 16;
#pragma unroll
  for (int d = 0; d < kDim / 16; ++d) {
    uint32_t a[4];
    LoadMatricesTransposed(v_at + d * 32, a);
    Mma(rows.o[d], a, p_high[0], p_high[1]);
    Mma(rows.o[d], a, p_low[0], p_low[1]);
  }
}

}  // namespace tiles_internal

// The tile streaming of one block over the tokens lo..hi-1 of slot_ids, in two calls that every
// thread of the block makes: StartTiles, then AttendTiles. Each token's k and v rows of the kv head
// are read at slot * slot_stride + head_offset, kStages tiles at a time. `smem` is
// TileLayout<kDim, kStages>::kBytes of dynamic shared memory (16-byte aligned), free again when
// AttendTiles returns.
template <int kDim, int kStages>
struct TileStream {
  // How many tiles are in flight before the block attends to the first: StartTiles queues them.
  static constexpr int kTilesAhead = kStages - 1;

  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  const int32_t* slot_ids;
  int64_t slot_stride;
  int64_t head_offset;
  int lo, hi;
  unsigned char* smem;

  __device__ __forceinline__ int tiles() const { return hi > lo ? (hi - lo + kTileTokens - 1) / kTileTokens : 0; }

  // Queues the copies of the first kTilesAhead tiles (their slot ids are loaded first) and of the
  // next tiles' slot ids. It reads slot_ids and the rows of the tokens lo..lo + kTilesAhead * 64 - 1
  // (within hi), so a caller may start before those rows' last writer ends only when they exclude
  // what that writer writes.
  __device__ __forceinline__ void StartTiles() const {
    constexpr int kSlotsPerThread = kTileTokens * (kDim / 8) / kTileThreads;
    const uint32_t base = SharedAddress(smem);
    const int n = tiles();
    // Tile t goes in flight kTilesAhead turns before its own, in the copy group of turn
    // t - kTilesAhead (the first ones here), and its slot ids as many turns before that: every turn
    // of AttendTiles then finds its tile landed and the slot ids of the tile it queues.
    int first_slots[kTilesAhead][kSlotsPerThread];
#pragma unroll
    for (int t = 0; t < kTilesAhead; ++t) {
      if (t < n) tiles_internal::LoadTileSlots<kDim>(slot_ids, lo, hi, t, first_slots[t]);
    }
#pragma unroll
    for (int t = 0; t < kTilesAhead; ++t) {
      if (t < n) {
        tiles_internal::CopyTile<kDim, kStages>(base, t, first_slots[t], k_cache, v_cache, slot_stride, head_offset);
      }
      if (t + kTilesAhead < n) tiles_internal::CopyTileSlots<kDim, kStages>(smem, slot_ids, lo, hi, t + kTilesAhead);
      CommitCopies();  // empty groups too, so that every turn below counts the same
    }
  }

  // Attends to the chunk, after StartTiles. `make_query(high, low)` gives the query's fragments
  // (QueryFragments); it is called first, while the first tiles are in flight. Leaves each warp's
  // share in `rows`, with the row sums added up.
  template <typename MakeQuery>
  __device__ void AttendTiles(const MakeQuery& make_query, WarpRows<kDim>& rows) const {
    using Layout = TileLayout<kDim, kStages>;
    constexpr int kSlotsPerThread = kTileTokens * (kDim / 8) / kTileThreads;
    const uint32_t base = SharedAddress(smem);
    const int n = tiles();
    uint32_t q_high[kDim / 16][2], q_low[kDim / 16][2];
    make_query(q_high, q_low);

    const int warp = threadIdx.x / 32;
    int slots[kSlotsPerThread];
    for (int tile = 0; tile < n; ++tile) {
      WaitCopies<kTilesAhead - 1>();  // this thread's copies of `tile` have landed
      __syncthreads();                // and every thread's; the stage of tile - 1 is free again
      const int next = tile + kTilesAhead;
      if (next < n) {
        tiles_internal::ReadTileSlots<kDim, kStages>(smem, lo, hi, next, slots);
        tiles_internal::CopyTile<kDim, kStages>(base, next, slots, k_cache, v_cache, slot_stride, head_offset);
        if (next + kTilesAhead < n) {
          tiles_internal::CopyTileSlots<kDim, kStages>(smem, slot_ids, lo, hi, next + kTilesAhead);
        }
      }
      CommitCopies();
      const int first = lo + tile * kTileTokens + 16 * warp;
      if (first < hi) {
        tiles_internal::AttendWarpTokens<kDim>(q_high, q_low, base + (tile % kStages) * Layout::kStageBytes, first, hi,
                                               rows);
      }
    }
    WaitCopies<0>();
    __syncthreads();
    rows.sum += __shfl_xor_sync(0xffffffffu, rows.sum, 1);
    rows.sum += __shfl_xor_sync(0xffffffffu, rows.sum, 2);
  }
};

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_DECODE_TILES_CUH_
