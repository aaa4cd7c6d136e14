// Device side of packets (packets.h): a packet's eight 16-byte pieces, a lane each, stored and
// loaded in one instruction a warp, and where a packet's floats lie in its row. For the packet
// kernels (packets.cu) and the linked decode launch that polls and writes packets itself
// (decode_link.cuh). Include only from .cu files.
#ifndef LAMINA_KERNELS_CUDA_PACKETS_CUH_
#define LAMINA_KERNELS_CUDA_PACKETS_CUH_

#include <cstdint>

#include "kernels/cuda/lines.cuh"
#include "kernels/cuda/packets.h"

namespace lamina::kernels::cuda {

// A packet's 16-byte pieces; lane `piece` of a packet holds floats [4 * piece, 4 * piece + 4) of
// its 31, and the last piece three floats and the tag (in .w).
constexpr int kPacketPieces = 8;

__device__ __forceinline__ void StorePacketPiece(Packet* packet, int piece, uint4 words) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<uint4*>(packet) + piece),
               "r"(words.x), "r"(words.y), "r"(words.z), "r"(words.w)
               : "memory");
}

__device__ __forceinline__ uint4 LoadPacketPiece(const Packet* packet, int piece) {
  uint4 w;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
               : "l"(reinterpret_cast<const uint4*>(packet) + piece)
               : "memory");
  return w;
}

// Eight lanes a packet: each warp polls its packets at[i] (those whose bit is set in `wanted`) at
// once until each holds `tag` or `poll` gives up, then loads each once more, as NCCL's LL128 does
// (a load that raced a packet's arrival may have taken part of it before and its tag after).
// words[i] is then the lane's piece of packet i (zeros where not wanted). Every lane of the warp
// calls it (the shuffles need them all); a packet's eight lanes share its bit of `wanted`.
template <int kRounds>
__device__ __forceinline__ void PollPackets(const Packet* const (&at)[kRounds], uint32_t wanted, uint32_t tag,
                                            LinePoll& poll, uint4 (&words)[kRounds]) {
  const int piece = threadIdx.x % kPacketPieces;
  const int tag_lane = (threadIdx.x % 32) | (kPacketPieces - 1);
#pragma unroll
  for (int i = 0; i < kRounds; ++i) words[i] = make_uint4(0, 0, 0, 0);
  uint32_t pending = wanted;
  for (int spins = 0; __any_sync(0xffffffffu, pending != 0); ++spins) {
#pragma unroll
    for (int i = 0; i < kRounds; ++i) {
      if (pending & (1u << i)) words[i] = LoadPacketPiece(at[i], piece);
    }
#pragma unroll
    for (int i = 0; i < kRounds; ++i) {
      const bool in = __shfl_sync(0xffffffffu, words[i].w == tag, tag_lane);
      if (in || poll.failed) pending &= ~(1u << i);
    }
    if (pending != 0 && (spins + 1) % kSpinsBetweenChecks == 0) CheckPoll(poll);
  }
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    if (wanted & (1u << i)) words[i] = LoadPacketPiece(at[i], piece);
  }
}

// Whether value `i` (0 to 3) of piece `piece` is a float rather than the tag.
__device__ __forceinline__ bool HoldsFloat(int piece, int i) { return piece < kPacketPieces - 1 || i < 3; }

// Where packet `in_row` of a row in parts of `part_cols` floats, `per_part` packets each
// (PacketsPerRow(part_cols)), `per_row` in all, starts in the row, and where its part ends.
struct PacketSpan {
  int first_col;
  int end_col;
};
__device__ __forceinline__ PacketSpan SpanOf(int in_row, int part_cols, int per_part, int per_row) {
  if (per_part == per_row) return {in_row * static_cast<int>(kPacketFloats), part_cols};  // one part: no divide
  const int part = in_row / per_part;
  return {part * part_cols + (in_row - part * per_part) * static_cast<int>(kPacketFloats), (part + 1) * part_cols};
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_PACKETS_CUH_
