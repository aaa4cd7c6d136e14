// The weights of a LLaMA-family model, loaded from a Hugging Face folder and converted to float32
// (a bf16 or fp16 checkpoint takes twice its file size in memory; the tiny and demo models are a
// few MB). q, k and v projections are fused into one matrix, as are gate and up.
// Immutable after Load(); thread-safe to read.
#ifndef LAMINA_COMPUTE_NODE_MODEL_MODEL_WEIGHTS_H_
#define LAMINA_COMPUTE_NODE_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config/model_config.h"
#include "common/tensor/tensor.h"
#include "compute_node/model/weight_share.h"

namespace lamina {

struct LayerWeights {
  Tensor input_norm;  // [hidden]
  Tensor qkv;         // [q_size + 2 * kv_size, hidden]: rows of q, then k, then v
  Tensor qkv_bias;    // [q_size + 2 * kv_size], empty without attention bias
  Tensor o_proj;      // [hidden, q_size]
  Tensor post_norm;   // [hidden]
  Tensor gate_up;     // [2 * intermediate, hidden]: rows of gate, then up
  Tensor down;        // [hidden, intermediate]
};

struct ModelWeights {
  ModelConfig config;
  Tensor embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden]; empty when tied to embed
  const Tensor& head() const { return lm_head.size() > 0 ? lm_head : embed; }

  // Reads config.json and the safetensors checkpoint in `dir` (the tensors of `share`: the others
  // stay empty and are not read; of a tensor-parallel rank's, only its slices are read, and
  // `config` is the rank's, RankConfig). Errors name the file and the tensor: missing tensors,
  // wrong shapes, unsupported dtypes, truncated or corrupt files.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const std::string& dir, const WeightShare& share = {});

  // Weights of `config`'s shape drawn from `seed` (a topology's `weights: random`): each tensor
  // uniform in [-scale, scale], scale about 1/sqrt(fan_in) for projections and 1 for norms and
  // the embedding. The values are those of CudaModelWeights::Random for the same seed before its
  // bf16 rounding, so the CPU model is the GPU one's oracle. Untied head, no attention bias. Only
  // `share`'s layers' tensors are drawn, whole (a tensor-parallel rank's slices are then cut by
  // ShardWeights); each has the values it has in the whole model.
  static std::unique_ptr<ModelWeights> Random(const ModelConfig& config, uint64_t seed, const WeightShare& share = {});
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_MODEL_MODEL_WEIGHTS_H_
