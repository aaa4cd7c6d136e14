#include "common/topology/kv_dtype.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace lamina {

absl::StatusOr<DType> ChooseKvDtype(std::string_view setting, const ModelConfig& config, bool on_gpu) {
  if (setting == "bfloat16") return DType::kBF16;
  if (setting == "float8_e4m3") return DType::kF8E4M3;
  if (setting == "float32") {
    if (on_gpu) return absl::InvalidArgumentError("float32 is for the CPU; a GPU's KV pool is bfloat16 or float8_e4m3");
    return DType::kF32;
  }
  if (setting == "auto") return on_gpu || config.dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("expected auto, float32, bfloat16 or float8_e4m3, got '", std::string(setting), "'"));
}

const char* KvDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF8E4M3:
      return "float8_e4m3";
    default:
      return "float32";
  }
}

int64_t KvBytesPerToken(DType dtype, const ModelConfig& config) {
  const int64_t scales = dtype == DType::kF8E4M3 ? config.num_kv_heads * static_cast<int64_t>(sizeof(float)) : 0;
  return 2 * config.num_layers * (config.kv_size() * static_cast<int64_t>(DTypeSize(dtype)) + scales);
}

}  // namespace lamina
