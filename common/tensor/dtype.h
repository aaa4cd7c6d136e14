// Element types found in checkpoints, and conversions to float32.
// Thread-safe: everything here is a pure function.
#ifndef LAMINA_COMMON_TENSOR_DTYPE_H_
#define LAMINA_COMMON_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace lamina {

// kF8E4M3 (float8 e4m3, float8_e4m3fn in PyTorch) is a KV pool's element type only
// (common/tensor/float8.h): ParseDType does not accept it, as Lamina reads no float8 checkpoints.
enum class DType { kF32, kF16, kBF16, kI64, kI32, kF8E4M3 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "F16", "BF16", "I64", "I32", "F8_E4M3".
const char* DTypeName(DType dtype);
// Parses a safetensors dtype string; InvalidArgument names an unsupported one.
absl::StatusOr<DType> ParseDType(std::string_view name);

float BFloat16ToFloat(uint16_t bits);
float Float16ToFloat(uint16_t bits);
// Round-to-nearest-even, as PyTorch does.
uint16_t FloatToBFloat16(float value);

// Converts `count` elements of `dtype` at `src` (any alignment) to float32 in `dst`.
// Integer dtypes convert by value.
void ConvertToFloat32(DType dtype, const void* src, size_t count, float* dst);

}  // namespace lamina

#endif  // LAMINA_COMMON_TENSOR_DTYPE_H_
