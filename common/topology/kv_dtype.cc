#include "common/topology/kv_dtype.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace lamina {

absl::StatusOr<DType> ChooseKvDtype(std::string_view setting, const ModelConfig& config, bool on_gpu) {
  if (setting == "bfloat16") return DType::kBF16;
  if (setting == "float32") {
    if (on_gpu) return absl::InvalidArgumentError("float32 is for the CPU; a GPU's KV pool is bfloat16");
    return DType::kF32;
  }
  if (setting == "auto") return on_gpu || config.dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("expected auto, float32 or bfloat16, got '", std::string(setting), "'"));
}

const char* KvDtypeName(DType dtype) { return dtype == DType::kBF16 ? "bfloat16" : "float32"; }

}  // namespace lamina
