#include "common/tensor/float8.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

// The e4m3 codes that stand for finite values: all but 0x7F and 0xFF.
std::vector<uint8_t> FiniteCodes() {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F) codes.push_back(static_cast<uint8_t>(c));
  }
  return codes;
}

// The nearest finite e4m3 value to x by search over every code, ties to the even code (mantissa
// bit 0 clear), magnitudes beyond 448 saturated: the definition FloatToFloat8E4M3 must meet.
uint8_t NearestBySearch(float x) {
  uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  const double clamped = std::fmax(-448.0, std::fmin(448.0, static_cast<double>(x)));
  for (uint8_t c : FiniteCodes()) {
    if ((c & 0x7F) == 0 && (c & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;  // zero keeps x's sign
    const double distance = std::fabs(Float8E4M3ToFloat(c) - clamped);
    if (distance < best_distance || (distance == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = distance;
    }
  }
  return best;
}

TEST(Float8Test, DecodesKnownCodesAndIsMonotonic) {
  EXPECT_EQ(Float8E4M3ToFloat(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(Float8E4M3ToFloat(0x80)));
  EXPECT_EQ(Float8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Float8E4M3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(Float8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Float8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Float8E4M3ToFloat(0x3C), 1.5f);
  EXPECT_EQ(Float8E4M3ToFloat(0xC4), -3.0f);
  EXPECT_EQ(Float8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Float8E4M3ToFloat(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(Float8E4M3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(Float8E4M3ToFloat(0xFF)));
  for (int c = 1; c < 0x7F; ++c) {
    EXPECT_LT(Float8E4M3ToFloat(c - 1), Float8E4M3ToFloat(c)) << "code " << c;
    EXPECT_EQ(Float8E4M3ToFloat(c | 0x80), -Float8E4M3ToFloat(c)) << "code " << c;
  }
}

TEST(Float8Test, EveryFiniteCodeRoundTrips) {
  for (uint8_t c : FiniteCodes()) EXPECT_EQ(FloatToFloat8E4M3(Float8E4M3ToFloat(c)), c) << "code " << int{c};
}

TEST(Float8Test, EncodesToTheNearestValueWithTiesToEven) {
  // Every midpoint between neighbours (a tie), and just either side of it.
  for (int c = 0; c < 0x7E; ++c) {
    const float low = Float8E4M3ToFloat(c), high = Float8E4M3ToFloat(c + 1);
    const float middle = (low + high) / 2;  // exact: the two differ in few bits
    EXPECT_EQ(FloatToFloat8E4M3(middle), c % 2 == 0 ? c : c + 1) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(FloatToFloat8E4M3(std::nextafter(middle, 0.0f)), c) << "below the middle of " << c;
    EXPECT_EQ(FloatToFloat8E4M3(std::nextafter(middle, 1e3f)), c + 1) << "above the middle of " << c;
    EXPECT_EQ(FloatToFloat8E4M3(-middle), (c % 2 == 0 ? c : c + 1) | 0x80) << "negative, codes " << c;
  }
  // Random values over the whole range, uniform in magnitude's logarithm.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exponent(-14, 10);
  for (int i = 0; i < 20000; ++i) {
    const float x = (i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
    ASSERT_EQ(FloatToFloat8E4M3(x), NearestBySearch(x)) << "x = " << x;
  }
}

TEST(Float8Test, SaturatesBeyond448AndKeepsNaN) {
  EXPECT_EQ(FloatToFloat8E4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToFloat8E4M3(463.9f), 0x7E);
  EXPECT_EQ(FloatToFloat8E4M3(1e9f), 0x7E);
  EXPECT_EQ(FloatToFloat8E4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToFloat8E4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(FloatToFloat8E4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToFloat8E4M3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest step
  EXPECT_EQ(FloatToFloat8E4M3(-std::ldexp(1.0f, -11)), 0x80);
}

TEST(Float8Test, QuantizeScalesEachHeadToItsLargestValue) {
  const int64_t heads = 3, head_dim = 40;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x(heads * head_dim);
  const float spread[heads] = {1e-3f, 1.0f, 3e4f};
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < head_dim; ++i) x[h * head_dim + i] = spread[h] * normal(rng);
  }
  std::vector<uint8_t> codes(heads * head_dim);
  std::vector<float> scales(heads);
  QuantizeFloat8E4M3(x.data(), heads, head_dim, codes.data(), scales.data());
  for (int64_t h = 0; h < heads; ++h) {
    float largest = 0;
    for (int64_t i = 0; i < head_dim; ++i) largest = std::fmax(largest, std::fabs(x[h * head_dim + i]));
    EXPECT_FLOAT_EQ(scales[h], largest / 448) << "head " << h;
    bool reached_448 = false;
    for (int64_t i = 0; i < head_dim; ++i) {
      const float value = x[h * head_dim + i];
      const float back = Float8E4M3ToFloat(codes[h * head_dim + i]) * scales[h];
      reached_448 = reached_448 || (codes[h * head_dim + i] & 0x7F) == 0x7E;
      // Within 1/16 of itself in e4m3's normal range, else half a subnormal step of the scale.
      const float bound = std::fmax(std::fabs(value) / 16, std::ldexp(scales[h], -10)) * 1.0001f;
      EXPECT_LE(std::fabs(back - value), bound) << "head " << h << ", value " << i;
      EXPECT_EQ(codes[h * head_dim + i], FloatToFloat8E4M3(value * (448 / largest))) << "head " << h << ", " << i;
    }
    EXPECT_TRUE(reached_448) << "head " << h;
  }
}

TEST(Float8Test, QuantizeGivesZerosAScaleOfZeroAndNonFiniteHeadsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float x[4][2] = {{0.0f, -0.0f}, {1e-31f, -2e-31f}, {1.0f, nan}, {inf, 2.0f}};
  uint8_t codes[8];
  float scales[4];
  QuantizeFloat8E4M3(&x[0][0], 4, 2, codes, scales);
  EXPECT_EQ(scales[0], 0.0f);
  EXPECT_EQ(scales[1], 0.0f);
  EXPECT_TRUE(std::isnan(scales[2]));
  EXPECT_TRUE(std::isnan(scales[3]));
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
}

}  // namespace
}  // namespace lamina
