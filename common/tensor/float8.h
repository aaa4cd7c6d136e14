// Float8 e4m3 values (the OCP FP8 "E4M3" format, PyTorch's float8_e4m3fn): 1 sign bit, 4 exponent
// bits (bias 7), 3 mantissa bits, no infinities, and 0x7F / 0xFF for NaN. Magnitudes run from
// 2^-9 (subnormal) to 448, each normal one kept to 3 significant bits: a value rounds to within
// 1/16 of itself. A KV pool of them takes a quarter of float32's bytes and half of bfloat16's.
// Thread-safe: pure functions.
#ifndef LAMINA_COMMON_TENSOR_FLOAT8_H_
#define LAMINA_COMMON_TENSOR_FLOAT8_H_

#include <cstdint>

namespace lamina {

// The largest finite e4m3 magnitude.
inline constexpr float kFloat8E4M3Max = 448.0f;

// The value of e4m3 bits, exactly; NaN for 0x7F and 0xFF.
float Float8E4M3ToFloat(uint8_t bits);

// The e4m3 value nearest `value` (ties to even). Magnitudes beyond 448, infinities included,
// saturate to ±448; NaN gives 0x7F.
uint8_t FloatToFloat8E4M3(float value);

// Quantizes `heads` rows of `head_dim` floats at x, each with its own scale: head h's scale is
// its largest magnitude ÷ 448, its codes the e4m3 values nearest x ÷ scale, so that code × scale
// stands for x: the largest to float rounding, the others to within 1/16 of themselves down to
// 1/28,672 of the largest (where e4m3's normal values end), and below that to within 1/458,752 of
// the largest (half a subnormal step). A head of zeros, or of
// magnitudes all below 2^-100, has scale 0 and zero codes. A head holding a NaN or an infinity
// has scale NaN, so that every value of it reads back NaN, as a broken forward pass should show.
// codes: [heads, head_dim]; scales: [heads].
void QuantizeFloat8E4M3(const float* x, int64_t heads, int64_t head_dim, uint8_t* codes, float* scales);

}  // namespace lamina

#endif  // LAMINA_COMMON_TENSOR_FLOAT8_H_
