// Lines: the low-latency form of a small hop between GPUs (after NCCL's LL protocol). A row of
// floats travels as 16-byte lines, each holding two of its floats and two copies of a 32-bit tag
// that names the hop; the sender writes each line in one store, with no fence and no flag after
// them, and the receiver polls the lines themselves until both tags match. A hop of lines costs
// twice the bytes of plain rows but saves the fence that must drain the rows across the link
// before a flag may follow them (a few microseconds of a round trip), so it suits hops of a few
// rows.
//
// Lines mirror floats: the floats from a base address on map two to a line, float i into line
// i / 2, so a buffer of lines holds twice the bytes of the rows it mirrors. Each hop must carry a
// tag the buffer's lines do not already hold: LineTag(value) of flag values that only grow.
#ifndef LAMINA_KERNELS_CUDA_LINE_H_
#define LAMINA_KERNELS_CUDA_LINE_H_

#include <cstdint>

namespace lamina::kernels::cuda {

struct alignas(16) Line {
  float first;
  uint32_t first_tag;
  float second;
  uint32_t second_tag;
};
static_assert(sizeof(Line) == 16, "a line is one 16-byte store");

// The tag of a hop whose flag value is `value` (>= 1): never 0, which zeroed buffers hold, and
// distinct for 2^32 - 1 consecutive values.
#ifdef __CUDACC__
__host__ __device__
#endif
inline uint32_t LineTag(uint64_t value) {
  return static_cast<uint32_t>(value % 0xFFFFFFFFull) + 1;
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_LINE_H_
