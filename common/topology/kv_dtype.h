// The element type of a memory node's KV pool, from a topology's `kv_dtype` setting:
//   "bfloat16":    kBF16: half the bytes of float32, so twice the tokens in the same memory, and
//                  on the CPU rows read faster (each k/v value rounded to nearest even);
//   "float8_e4m3": kF8E4M3: a quarter of float32's bytes plus a float scale per token, layer and
//                  kv head (each head's values scaled to its largest and rounded to 3 significant
//                  bits, common/tensor/float8.h), on the CPU or a GPU alike;
//   "float32":     kF32, on the CPU only (a GPU's pool is bfloat16 or float8);
//   "auto":        kBF16 on a GPU, and on the CPU when the checkpoint is bfloat16 (config.json's
//                  dtype), as the framework it was made in keeps its cache; kF32 otherwise.
// Thread-safe: pure functions.
#ifndef LAMINA_COMMON_TOPOLOGY_KV_DTYPE_H_
#define LAMINA_COMMON_TOPOLOGY_KV_DTYPE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/model_config/model_config.h"
#include "common/tensor/dtype.h"

namespace lamina {

// InvalidArgument for another setting, or float32 on a GPU; its message names no
// field, for the caller to say where the setting came from.
absl::StatusOr<DType> ChooseKvDtype(std::string_view setting, const ModelConfig& config, bool on_gpu);

// "float32", "bfloat16" or "float8_e4m3", for logs.
const char* KvDtypeName(DType dtype);

// The bytes one token's keys and values take in a pool of `dtype` across the model's layers,
// float8's scales included.
int64_t KvBytesPerToken(DType dtype, const ModelConfig& config);

}  // namespace lamina

#endif  // LAMINA_COMMON_TOPOLOGY_KV_DTYPE_H_
