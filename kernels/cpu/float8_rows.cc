#include "kernels/cpu/float8_rows.h"

#include <immintrin.h>

#include <cstring>

namespace lamina::kernels::cpu {
namespace {

// One code from its bits, with no subnormal float in between (a CPU may slow down on those): the
// exponent and mantissa bits moved into a float's and rebiased (7 to 127 - 8) give 1.mmm ×
// 2^(e - 15); for exponent 0 that is 2^-15 + the subnormal's value / 512, so twice it less 2^-14
// is the subnormal's value / 256.
inline float WidenOne(uint8_t code) {
  const uint32_t magnitude = code & 0x7Fu;
  float normal;
  const uint32_t bits = (magnitude << 20) + (112u << 23);
  std::memcpy(&normal, &bits, sizeof(normal));
  const float value = magnitude < 8 ? (normal + normal) - 0x1p-14f : normal;
  return (code & 0x80) ? -value : value;
}

void WidenBaseline(const uint8_t* const* rows, int64_t num_rows, int64_t count, float* out) {
  for (int64_t j = 0; j < num_rows; ++j) {
    for (int64_t d = 0; d < count; ++d) out[j * count + d] = WidenOne(rows[j][d]);
  }
}

// The codes' bits sign-extended to 16 and shifted up 7 put the sign at bit 15 (and a copy at bit
// 14, masked off) and the exponent and mantissa at bits 13 to 7: a half-precision float's bits.
__attribute__((target("arch=x86-64-v3"))) void WidenAvx2(const uint8_t* const* rows, int64_t num_rows, int64_t count,
                                                         float* out) {
  const __m128i mask = _mm_set1_epi16(static_cast<int16_t>(0xBF80));
  for (int64_t j = 0; j < num_rows; ++j) {
    int64_t d = 0;
    for (; d + 8 <= count; d += 8) {
      const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[j] + d));
      const __m128i halves = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7), mask);
      _mm256_storeu_ps(out + j * count + d, _mm256_cvtph_ps(halves));
    }
    for (; d < count; ++d) out[j * count + d] = WidenOne(rows[j][d]);
  }
}

__attribute__((target("arch=x86-64-v4"))) void WidenAvx512(const uint8_t* const* rows, int64_t num_rows, int64_t count,
                                                           float* out) {
  const __m256i mask = _mm256_set1_epi16(static_cast<int16_t>(0xBF80));
  for (int64_t j = 0; j < num_rows; ++j) {
    int64_t d = 0;
    for (; d + 16 <= count; d += 16) {
      const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + d));
      const __m256i halves = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7), mask);
      // The masked conversion, all lanes on: GCC 12 warns of an uninitialized value in the plain one.
      _mm512_storeu_ps(out + j * count + d, _mm512_maskz_cvtph_ps(0xFFFF, halves));
    }
    for (; d < count; ++d) out[j * count + d] = WidenOne(rows[j][d]);
  }
}

}  // namespace

WidenFloat8RowsFn WidenFloat8RowsFor(Isa isa) {
  return isa == Isa::kAvx512 ? WidenAvx512 : isa == Isa::kAvx2 ? WidenAvx2 : WidenBaseline;
}

}  // namespace lamina::kernels::cpu
