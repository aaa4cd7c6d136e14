#include "common/topology/kv_dtype.h"

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(KvDtypeTest, AutoFollowsTheCheckpointOnTheCpuAndIsBfloat16OnAGpu) {
  ModelConfig bf16_checkpoint, f32_checkpoint, unsaid;
  bf16_checkpoint.dtype = "bfloat16";
  f32_checkpoint.dtype = "float32";
  EXPECT_EQ(*ChooseKvDtype("auto", bf16_checkpoint, false), DType::kBF16);
  EXPECT_EQ(*ChooseKvDtype("auto", f32_checkpoint, false), DType::kF32);
  EXPECT_EQ(*ChooseKvDtype("auto", unsaid, false), DType::kF32);
  EXPECT_EQ(*ChooseKvDtype("auto", f32_checkpoint, true), DType::kBF16);
  EXPECT_EQ(*ChooseKvDtype("bfloat16", f32_checkpoint, false), DType::kBF16);
  EXPECT_EQ(*ChooseKvDtype("float32", bf16_checkpoint, false), DType::kF32);
  EXPECT_EQ(*ChooseKvDtype("bfloat16", f32_checkpoint, true), DType::kBF16);
}

TEST(KvDtypeTest, RefusesFloat32OnAGpuAndUnknownSettings) {
  const ModelConfig config;
  absl::StatusOr<DType> gpu = ChooseKvDtype("float32", config, true);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu.status().message(), "float32 is for the CPU; a GPU's KV pool is bfloat16 or float8_e4m3");
  absl::StatusOr<DType> fp8 = ChooseKvDtype("fp8", config, false);
  EXPECT_EQ(fp8.status().message(), "expected auto, float32, bfloat16 or float8_e4m3, got 'fp8'");
  EXPECT_EQ(*ChooseKvDtype("float8_e4m3", config, true), DType::kF8E4M3);
  EXPECT_EQ(*ChooseKvDtype("float8_e4m3", config, false), DType::kF8E4M3);
  EXPECT_STREQ(KvDtypeName(DType::kBF16), "bfloat16");
  EXPECT_STREQ(KvDtypeName(DType::kF32), "float32");
  EXPECT_STREQ(KvDtypeName(DType::kF8E4M3), "float8_e4m3");
}

TEST(KvDtypeTest, Float8TakesAQuarterOfFloat32sBytesPlusAScalePerHead) {
  ModelConfig config;
  config.num_layers = 6;
  config.num_kv_heads = 4;
  config.head_dim = 32;
  EXPECT_EQ(*ChooseKvDtype("float8_e4m3", config, false), DType::kF8E4M3);
  EXPECT_EQ(KvBytesPerToken(DType::kF32, config), 2 * 6 * 128 * 4);
  EXPECT_EQ(KvBytesPerToken(DType::kBF16, config), 2 * 6 * 128 * 2);
  EXPECT_EQ(KvBytesPerToken(DType::kF8E4M3, config), 2 * 6 * (128 + 4 * 4));
}

}  // namespace
}  // namespace lamina
