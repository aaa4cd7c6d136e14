#include "common/tensor/dtype.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(DTypeTest, BFloat16RoundTripsAndRoundsToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 3.140625f, std::ldexp(1.0f, -70), 65024.0f}) {
    EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(v)), v) << v;
  }
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, Float16DecodesNormalsSubnormalsAndSpecials) {
  EXPECT_EQ(Float16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Float16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Float16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Float16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Float16ToFloat(0x0200), std::ldexp(1.0f, -15));
  EXPECT_TRUE(std::isinf(Float16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(Float16ToFloat(0x7e00)));
}

TEST(DTypeTest, ParsesSafetensorsNames) {
  EXPECT_EQ(*ParseDType("BF16"), DType::kBF16);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(ParseDType("F8_E4M3").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lamina
