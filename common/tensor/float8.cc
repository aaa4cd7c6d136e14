#include "common/tensor/float8.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace lamina {
namespace {

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

}  // namespace

float Float8E4M3ToFloat(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: 0.mmm × 2^-6
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // 1.mmm × 2^(e - 7)
  }
  return (bits & 0x80) ? -magnitude : magnitude;
}

uint8_t FloatToFloat8E4M3(float value) {
  const uint32_t bits = BitsOf(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
  if (magnitude_bits > 0x7F800000u) return sign | 0x7F;  // NaN
  const float magnitude = std::fabs(value);
  if (magnitude >= kFloat8E4M3Max) return sign | 0x7E;  // saturates, infinity included
  if (magnitude < 0x1p-6f) {
    // Subnormal: a multiple of 2^-9 (the product below is exact; rint rounds ties to even). Code
    // 8, reached by rounding up, is the smallest normal value, 2^-6.
    return sign | static_cast<uint8_t>(std::rint(magnitude * 512.0f));
  }
  // Normal: the float's exponent (127-biased, 121 to 135 here) and its top 3 mantissa bits,
  // rounded to nearest even on the 20 bits below them; a carry moves into the exponent. Then
  // rebiased to 7. Below 448, rounding reaches 448 (0x7E) at most.
  const uint32_t rounded = magnitude_bits + 0x7FFFFu + ((magnitude_bits >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - (120u << 3));
}

void QuantizeFloat8E4M3(const float* x, int64_t heads, int64_t head_dim, uint8_t* codes, float* scales) {
  for (int64_t h = 0; h < heads; ++h) {
    const float* row = x + h * head_dim;
    uint8_t* out = codes + h * head_dim;
    float largest = 0;
    bool finite = true;
    for (int64_t i = 0; i < head_dim; ++i) {
      const float magnitude = std::fabs(row[i]);
      finite = finite && magnitude <= std::numeric_limits<float>::max();
      largest = magnitude > largest ? magnitude : largest;
    }
    if (!finite || largest < 0x1p-100f) {
      std::memset(out, 0, head_dim);
      scales[h] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float inverse = kFloat8E4M3Max / largest;
    for (int64_t i = 0; i < head_dim; ++i) out[i] = FloatToFloat8E4M3(row[i] * inverse);
    scales[h] = largest / kFloat8E4M3Max;
  }
}

}  // namespace lamina
