// Widening float8 e4m3 codes (common/tensor/float8.h) to floats, for the CPU attention over a
// float8 KV cache: each code becomes 1/256 of the value it stands for, exactly (the value a
// half-precision float holds whose bits are the e4m3 sign, then its exponent and mantissa bits at
// the top of the half's: the half's exponent bias is 15, not 7). The caller folds the 256 into its
// scale. Codes 0x7F and 0xFF (e4m3's NaN, which QuantizeFloat8E4M3 never writes) become ±480/256.
// With AVX-512 and with AVX2, the CPU's half-precision conversion does it, 16 or 8 codes an
// instruction; the baseline builds each float from its bits. Thread-safe.
#ifndef LAMINA_KERNELS_CPU_FLOAT8_ROWS_H_
#define LAMINA_KERNELS_CPU_FLOAT8_ROWS_H_

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace lamina::kernels::cpu {

// out[j * count + d] = code rows[j][d] / 256, for j < num_rows and d < count.
using WidenFloat8RowsFn = void (*)(const uint8_t* const* rows, int64_t num_rows, int64_t count, float* out);

// The widening compiled for `isa`; call it only where the CPU has that instruction set.
WidenFloat8RowsFn WidenFloat8RowsFor(Isa isa);

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_FLOAT8_ROWS_H_
