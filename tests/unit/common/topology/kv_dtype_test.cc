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
  EXPECT_EQ(gpu.status().message(), "float32 is for the CPU; a GPU's KV pool is bfloat16");
  absl::StatusOr<DType> fp8 = ChooseKvDtype("fp8", config, false);
  EXPECT_EQ(fp8.status().message(), "expected auto, float32 or bfloat16, got 'fp8'");
  EXPECT_STREQ(KvDtypeName(DType::kBF16), "bfloat16");
  EXPECT_STREQ(KvDtypeName(DType::kF32), "float32");
}

}  // namespace
}  // namespace lamina
