// A model's weights on one GPU in bf16 (norm weights too; biases stay float32): read from a
// checkpoint straight to the GPU (a bf16 checkpoint's bytes as they are, an fp16 or fp32 one's
// rounded on the host a piece at a time, never the whole model in float32 on the host), uploaded
// from a float32 ModelWeights, or filled with random values for benchmarks of a model shape
// without a checkpoint. Load and Upload give the same bits for the same checkpoint.
// Immutable after creation; thread-safe to read.
#ifndef LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_MODEL_WEIGHTS_H_
#define LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_MODEL_WEIGHTS_H_

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"
#include "common/model_config/model_config.h"
#include "compute_node/model/model_weights.h"

namespace lamina {

struct CudaLayerWeights {
  cuda::DeviceBuffer input_norm;  // bf16 [hidden]
  cuda::DeviceBuffer qkv;         // bf16 [q_size + 2 kv_size, hidden]
  cuda::DeviceBuffer qkv_bias;    // float [q_size + 2 kv_size], empty without bias
  cuda::DeviceBuffer o_proj;      // bf16 [hidden, q_size]
  cuda::DeviceBuffer post_norm;   // bf16 [hidden]
  cuda::DeviceBuffer gate_up;     // bf16 [2 intermediate, hidden]
  cuda::DeviceBuffer down;        // bf16 [hidden, intermediate]
};

struct CudaModelWeights {
  ModelConfig config;
  cuda::DeviceBuffer embed;       // bf16 [vocab, hidden]
  std::vector<CudaLayerWeights> layers;
  cuda::DeviceBuffer final_norm;  // bf16 [hidden]
  cuda::DeviceBuffer lm_head;     // bf16 [vocab, hidden]; empty when tied to embed
  cuda::DeviceBuffer rope;        // float [max_position, head_dim]: cos and sin (kernels/cuda/elementwise.h)

  const __nv_bfloat16* head() const {
    return (lm_head.bytes() ? lm_head : embed).as<__nv_bfloat16>();
  }
  // Bytes of the weights one decode step reads (everything but the embedding table).
  int64_t StepBytes() const;

  // Use the current device. ResourceExhausted naming the tensor when the GPU is full; Load's
  // checkpoint errors name the file and tensor, as ModelWeights::Load's do.
  // Load and Random hold `share`'s tensors only (the others stay empty buffers); Upload what the
  // host weights hold.
  static absl::StatusOr<std::unique_ptr<CudaModelWeights>> Load(const std::string& model_dir,
                                                                const WeightShare& share = {});
  static absl::StatusOr<std::unique_ptr<CudaModelWeights>> Upload(const ModelWeights& weights);
  static absl::StatusOr<std::unique_ptr<CudaModelWeights>> Random(const ModelConfig& config, uint64_t seed,
                                                                  const WeightShare& share = {});
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_MODEL_WEIGHTS_H_
