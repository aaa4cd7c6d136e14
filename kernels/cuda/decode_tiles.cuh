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
//
// Over a float8 cache (Float8KvLayer) the tiles hold the codes, half the bytes, and each token's
// k and v scales; each lane loads the codes its fragments hold straight from the tile and widens
// them to bf16 in registers (AttendWarpFloat8Tokens), each score times its key's scale, each
// softmax weight times its value's scale in the products (not in the sum).
#ifndef LAMINA_KERNELS_CUDA_DECODE_TILES_CUH_
#define LAMINA_KERNELS_CUDA_DECODE_TILES_CUH_

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/float8.cuh"
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

// One layer of a bf16 KV cache, as the kernels take it ([num_slots, kv_heads, head_dim] each).
struct Bf16KvLayer {
  __nv_bfloat16* k;
  __nv_bfloat16* v;
};

template <typename Kv>
constexpr bool kIsFloat8 = std::is_same_v<Kv, Float8KvLayer>;

// A stage holds a tile's k rows, then its v rows, each padded by 16 bytes so that the 8 rows an
// ldmatrix reads start in different banks; float8, rows of codes, then the tile's 64 k scales and
// 64 v scales. After the stages, a ring of the slot ids of kStages tiles, copied there ahead of
// their tiles.
template <int kDim, int kStages, bool kFloat8 = false>
struct TileLayout {
  static constexpr int kRowBytes = kDim * 2 + 16;                          // a bf16 row
  static constexpr int kCopiedRowBytes = kFloat8 ? kDim + 16 : kRowBytes;  // a row as copied
  static constexpr int kScalesOffset = 2 * kTileTokens * kCopiedRowBytes;  // in a stage, float8
  static constexpr int kStageBytes = kScalesOffset + (kFloat8 ? 2 * kTileTokens * 4 : 0);
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
// floats. kFloat8: product ks takes the dims AttendWarpFloat8Tokens gives it, lane % 4 = c taking
// dims c·kDim/4 + 4ks + 0..3, rather than 16ks + 2c and 16ks + 2c + 8 onwards.
template <int kDim, int kG, bool kFloat8 = false, typename Load>
__device__ __forceinline__ void QueryFragments(const Load& load, float scale, uint32_t (&high)[kDim / 16][2],
                                               uint32_t (&low)[kDim / 16][2]) {
  const int lane = threadIdx.x % 32;
  const int row = lane / 4, col = 2 * (lane % 4);
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int d = kFloat8 ? (lane % 4) * (kDim / 4) + 4 * ks + 2 * half : 16 * ks + 8 * half + col;
      const float x0 = row < kG ? load(row * kDim + d) * scale : 0.f;
      const float x1 = row < kG ? load(row * kDim + d + 1) * scale : 0.f;
      SplitBf16(x0, x1, high[ks][half], low[ks][half]);
    }
  }
}

namespace tiles_internal {

// Copies tile `tile` of the chunk [lo, hi) into its stage. `slots` are the slot ids of this
// thread's rows of it (-1 past hi): row first_row + j * kRowsPerPass takes slots[j]. A row is
// kDim / 8 pieces: 16 bytes of bf16 values, or 8 of float8 codes, whose first piece's thread
// copies the row's two scales too.
template <int kDim, int kStages, typename Kv>
__device__ __forceinline__ void CopyTile(uint32_t smem, int tile, const int* slots, const Kv& cache,
                                         int64_t slot_stride, int64_t head_offset) {
  constexpr bool kFloat8 = kIsFloat8<Kv>;
  using Layout = TileLayout<kDim, kStages, kFloat8>;
  constexpr int kPieces = kDim / 8;
  constexpr int kPieceBytes = kFloat8 ? 8 : 16;
  constexpr int kRowsPerPass = kTileThreads / kPieces;
  const int piece = threadIdx.x % kPieces, first_row = threadIdx.x / kPieces;
  const uint32_t stage = smem + (tile % kStages) * Layout::kStageBytes;
#pragma unroll
  for (int j = 0; j < kTileTokens / kRowsPerPass; ++j) {
    const int row = first_row + j * kRowsPerPass;
    const bool valid = slots[j] >= 0;
    const int64_t at = valid ? slots[j] * slot_stride + head_offset + piece * 8 : 0;
    const uint32_t k_to = stage + row * Layout::kCopiedRowBytes + piece * kPieceBytes;
    const uint32_t v_to = k_to + kTileTokens * Layout::kCopiedRowBytes;
    if constexpr (kFloat8) {
      CopyAsync8(k_to, cache.k_codes + at, valid);
      CopyAsync8(v_to, cache.v_codes + at, valid);
      if (piece == 0) {
        const int64_t head = valid ? (slots[j] * slot_stride + head_offset) / kDim : 0;
        CopyAsync4(stage + Layout::kScalesOffset + row * 4, cache.k_scales + head, valid);
        CopyAsync4(stage + Layout::kScalesOffset + (kTileTokens + row) * 4, cache.v_scales + head, valid);
      }
    } else {
      CopyAsync16(k_to, cache.k + at, valid);
      CopyAsync16(v_to, cache.v + at, valid);
    }
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
template <int kDim, int kStages, bool kFloat8>
__device__ __forceinline__ void ReadTileSlots(const unsigned char* smem, int lo, int hi, int tile, int* slots) {
  constexpr int kRowsPerPass = kTileThreads / (kDim / 8);
  const int32_t* ring = reinterpret_cast<const int32_t*>(smem + TileLayout<kDim, kStages, kFloat8>::kSlotRingOffset) +
                        (tile % kStages) * kTileTokens;
  const int first_row = threadIdx.x / (kDim / 8);
#pragma unroll
  for (int j = 0; j < kTileTokens / kRowsPerPass; ++j) {
    const int row = first_row + j * kRowsPerPass;
    slots[j] = lo + tile * kTileTokens + row < hi ? ring[row] : -1;
  }
}

// Queues the copy of tile `tile`'s slot ids into the ring (zeros past hi), one 4-byte copy a token.
template <int kDim, int kStages, bool kFloat8>
__device__ __forceinline__ void CopyTileSlots(unsigned char* smem, const int32_t* slot_ids, int lo, int hi, int tile) {
  if (threadIdx.x >= kTileTokens) return;
  const int t = lo + tile * kTileTokens + threadIdx.x;
  const uint32_t to = SharedAddress(smem + TileLayout<kDim, kStages, kFloat8>::kSlotRingOffset) +
                      ((tile % kStages) * kTileTokens + threadIdx.x) * 4;
  CopyAsync4(to, t < hi ? slot_ids + t : slot_ids, t < hi);
}

// The online softmax over the warp's 16 tokens, given their scores' two parts (S's C fragments,
// tokens 8j..8j+7 in [j]), the first at chunk token `first` (< hi; tokens from `hi` on are
// masked): updates the rows' max and sum, rescales their outputs, and gives the probabilities as
// Pᵀ's B fragments, split in two bf16 parts. kScaled: token i's score is multiplied by k_scales[i]
// first, and its probability by v_scales[i] in the fragments (not in the sum); shared memory, the
// warp's 16 tokens each.
template <int kDim, bool kScaled>
__device__ __forceinline__ void SoftmaxStep(const float (&s_high)[2][4], const float (&s_low)[2][4], int first, int hi,
                                            const float* k_scales, const float* v_scales, WarpRows<kDim>& rows,
                                            uint32_t (&p_high)[2], uint32_t (&p_low)[2]) {
  const int lane = threadIdx.x % 32;
  // This lane's tokens' scales: 8j + 2 (lane % 4) + e, as its scores.
  float2 k_scale[2] = {}, v_scale[2] = {};
  if constexpr (kScaled) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      k_scale[j] = *reinterpret_cast<const float2*>(k_scales + 8 * j + 2 * (lane % 4));
      v_scale[j] = *reinterpret_cast<const float2*>(v_scales + 8 * j + 2 * (lane % 4));
    }
  }
  float s[2][2];
  float tile_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = first + 8 * j + 2 * (lane % 4) + e;
      const float scale = e == 0 ? k_scale[j].x : k_scale[j].y;
      s[j][e] = t < hi ? (kScaled ? (s_high[j][e] + s_low[j][e]) * scale : s_high[j][e] + s_low[j][e]) : -INFINITY;
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
  // Pᵀ's B fragment is S's layout: tokens 2c.. of n-tile 0, then of n-tile 1.
  if constexpr (kScaled) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      p[j][0] *= v_scale[j].x;
      p[j][1] *= v_scale[j].y;
    }
  }
  SplitBf16(p[0][0], p[0][1], p_high[0], p_low[0]);
  SplitBf16(p[1][0], p[1][1], p_high[1], p_low[1]);
}

// The warp's 16 tokens, their bf16 k and v rows at k_rows and v_rows (shared addresses,
// TileLayout::kRowBytes apart), the first of them at chunk token `first`; tokens from `hi` on are
// masked.
template <int kDim>
__device__ __forceinline__ void AttendWarpTokens(const uint32_t (&q_high)[kDim / 16][2],
                                                 const uint32_t (&q_low)[kDim / 16][2], uint32_t k_rows,
                                                 uint32_t v_rows, int first, int hi, WarpRows<kDim>& rows) {
  using Layout = TileLayout<kDim, kShallowTileStages>;  // only its row size, the same at every depth
  const int lane = threadIdx.x % 32;
  const int m = lane / 8, r = lane % 8;  // this lane addresses row r of 8 x 8 matrix m

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
  uint32_t p_high[2], p_low[2];
  SoftmaxStep<kDim, false>(s_high, s_low, first, hi, nullptr, nullptr, rows, p_high, p_low);

  // Oᵀ += Vᵀ·Pᵀ: Vᵀ comes out of shared memory transposed, 16 dims an A fragment, from the same
  // matrices as K's.
  const uint32_t v_at = v_rows + ((m / 2) * 8 + r) * Layout::kRowBytes + (m % 2) * 16;
#pragma unroll
  for (int d = 0; d < kDim / 16; ++d) {
    uint32_t a[4];
    LoadMatricesTransposed(v_at + d * 32, a);
    Mma(rows.o[d], a, p_high[0], p_high[1]);
    Mma(rows.o[d], a, p_low[0], p_low[1]);
  }
}

// kBytes (2 to 32, a power of two) bytes at `from` (shared memory, aligned to them, or to 16) as
// words, little-endian; a 2-byte load fills the low half of words[0].
template <int kBytes>
__device__ __forceinline__ void LoadCodeWords(const unsigned char* from,
                                              uint32_t (&words)[kBytes >= 4 ? kBytes / 4 : 1]) {
  if constexpr (kBytes == 2) {
    words[0] = *reinterpret_cast<const uint16_t*>(from);
  } else if constexpr (kBytes == 4) {
    words[0] = *reinterpret_cast<const uint32_t*>(from);
  } else if constexpr (kBytes == 8) {
    const uint2 w = *reinterpret_cast<const uint2*>(from);
    words[0] = w.x, words[1] = w.y;
  } else {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 w = reinterpret_cast<const uint4*>(from)[i];
      words[4 * i] = w.x, words[4 * i + 1] = w.y, words[4 * i + 2] = w.z, words[4 * i + 3] = w.w;
    }
  }
}

// The warp's 16 tokens over a float8 tile: their k and v rows of codes at k_rows and v_rows
// (shared memory, `row_bytes` apart), their scales at k_scales and v_scales, as SoftmaxStep takes
// them. The codes go from shared memory straight into the products' fragments, widened to bf16 in
// registers (exactly), each lane loading only what its fragments hold, whole:
//  - S = Q·Kᵀ: lane (g, c) = (lane / 4, lane % 4) holds token 8j + g's dims c·kDim/4 onwards
//    (n-tile j), kDim/4 contiguous codes, and product ks takes codes 4ks..4ks+3 of them as its B rows 2c, 2c + 1,
//    2c + 8, 2c + 9; the query's fragments follow the same order of dims (QueryFragments'
//    kFloat8), so each product still pairs every dim of Q with the same dim of K;
//  - Oᵀ += Vᵀ·Pᵀ: lane (g, c) holds tokens 2c, 2c + 1, 2c + 8 and 2c + 9's dims g·kDim/8 onwards,
//    kDim/8 contiguous codes each; product d takes codes 2d and 2d + 1 as its A rows g and g + 8,
//    paired across tokens with a byte permute. So output row g of product d is dim
//    g·kDim/8 + 2d, and row g + 8 is the next (DecodeKernel writes them back so).
template <int kDim>
__device__ __forceinline__ void AttendWarpFloat8Tokens(const uint32_t (&q_high)[kDim / 16][2],
                                                       const uint32_t (&q_low)[kDim / 16][2],
                                                       const unsigned char* k_rows, const unsigned char* v_rows,
                                                       int row_bytes, const float* k_scales, const float* v_scales,
                                                       int first, int hi, WarpRows<kDim>& rows) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  // Every load first, so that their latencies overlap: k's codes, then v's, which wait for the
  // softmax only in the products.
  uint32_t k_codes[2][kDim / 16];
#pragma unroll
  for (int j = 0; j < 2; ++j) LoadCodeWords<kDim / 4>(k_rows + (8 * j + g) * row_bytes + c * (kDim / 4), k_codes[j]);
  constexpr int kVBytes = kDim / 8;
  constexpr int kVWords = kVBytes >= 4 ? kVBytes / 4 : 1;
  uint32_t tokens[4][kVWords];  // tokens 2c, 2c + 1, 2c + 8, 2c + 9
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    LoadCodeWords<kVBytes>(v_rows + (2 * c + (i & 1) + 8 * (i >> 1)) * row_bytes + g * kVBytes, tokens[i]);
  }
  float s_high[2][4] = {}, s_low[2][4] = {};
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t b0 = WidenCodePair(k_codes[j][ks] & 0xffffu), b1 = WidenCodePair(k_codes[j][ks] >> 16);
      MmaUpperRows(s_high[j], q_high[ks][0], q_high[ks][1], b0, b1);
      MmaUpperRows(s_low[j], q_low[ks][0], q_low[ks][1], b0, b1);
    }
  }
  uint32_t p_high[2], p_low[2];
  SoftmaxStep<kDim, true>(s_high, s_low, first, hi, k_scales, v_scales, rows, p_high, p_low);

#pragma unroll
  for (int d = 0; d < kDim / 16; ++d) {
    // Codes 2d and 2d + 1 of two tokens, as [first's 2d, second's 2d, first's 2d + 1, second's].
    const int word = 2 * d / 4, at = 2 * d % 4;
    const uint32_t selector = at | (4 + at) << 4 | (at + 1) << 8 | (5 + at) << 12;
    const uint32_t low_tokens = __byte_perm(tokens[0][word], tokens[1][word], selector);
    const uint32_t high_tokens = __byte_perm(tokens[2][word], tokens[3][word], selector);
    const uint32_t a[4] = {WidenCodePair(low_tokens & 0xffffu), WidenCodePair(low_tokens >> 16),
                           WidenCodePair(high_tokens & 0xffffu), WidenCodePair(high_tokens >> 16)};
    Mma(rows.o[d], a, p_high[0], p_high[1]);
    Mma(rows.o[d], a, p_low[0], p_low[1]);
  }
}

}  // namespace tiles_internal

// The tile streaming of one block over the tokens lo..hi-1 of slot_ids, in two calls that every
// thread of the block makes: StartTiles, then AttendTiles. Each token's k and v rows of the kv head
// are read at slot * slot_stride + head_offset of `cache` (Bf16KvLayer or Float8KvLayer), kStages
// tiles at a time. `smem` is TileLayout<kDim, kStages, float8>::kBytes of dynamic shared memory
// (16-byte aligned), free again when AttendTiles returns.
template <int kDim, int kStages, typename Kv>
struct TileStream {
  // How many tiles are in flight before the block attends to the first: StartTiles queues them.
  static constexpr int kTilesAhead = kStages - 1;
  static constexpr bool kFloat8 = kIsFloat8<Kv>;
  using Layout = TileLayout<kDim, kStages, kFloat8>;

  Kv cache;
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
        tiles_internal::CopyTile<kDim, kStages>(base, t, first_slots[t], cache, slot_stride, head_offset);
      }
      if (t + kTilesAhead < n) {
        tiles_internal::CopyTileSlots<kDim, kStages, kFloat8>(smem, slot_ids, lo, hi, t + kTilesAhead);
      }
      CommitCopies();  // empty groups too, so that every turn below counts the same
    }
  }

  // Attends to the chunk, after StartTiles. `make_query(high, low)` gives the query's fragments
  // (QueryFragments); it is called first, while the first tiles are in flight. Leaves each warp's
  // share in `rows`, with the row sums added up.
  template <typename MakeQuery>
  __device__ void AttendTiles(const MakeQuery& make_query, WarpRows<kDim>& rows) const {
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
        tiles_internal::ReadTileSlots<kDim, kStages, kFloat8>(smem, lo, hi, next, slots);
        tiles_internal::CopyTile<kDim, kStages>(base, next, slots, cache, slot_stride, head_offset);
        if (next + kTilesAhead < n) {
          tiles_internal::CopyTileSlots<kDim, kStages, kFloat8>(smem, slot_ids, lo, hi, next + kTilesAhead);
        }
      }
      CommitCopies();
      const int first = lo + tile * kTileTokens + 16 * warp;
      if (first >= hi) continue;
      const int stage = (tile % kStages) * Layout::kStageBytes;
      if constexpr (kFloat8) {
        const unsigned char* k_rows = smem + stage + 16 * warp * Layout::kCopiedRowBytes;
        const float* scales = reinterpret_cast<const float*>(smem + stage + Layout::kScalesOffset) + 16 * warp;
        tiles_internal::AttendWarpFloat8Tokens<kDim>(
            q_high, q_low, k_rows, k_rows + kTileTokens * Layout::kCopiedRowBytes, Layout::kCopiedRowBytes, scales,
            scales + kTileTokens, first, hi, rows);
      } else {
        const uint32_t k_rows = base + stage + 16 * warp * Layout::kRowBytes;
        tiles_internal::AttendWarpTokens<kDim>(q_high, q_low, k_rows, k_rows + kTileTokens * Layout::kRowBytes, first,
                                               hi, rows);
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
