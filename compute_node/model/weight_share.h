// The part of a model's weights a compute node holds: all of it, or its share of a layer split
// (common/topology/slice_route.h). A node computing layers [first, end) runs those layers' o_proj
// and MLP, and the input norm, q/k/v projection and attention of the layer after each of them; so
// it holds the attention-out half of layers [first, end), the attention-in half of layers
// [first + 1, end + 1) (layer `end`'s belongs to the next node's layers, the one overlap), layer
// 0's attention-in half and the embedding on the first node, the final norm and head on the last
// (the embedding too when the head is tied to it). Tensors a share leaves out stay empty.
// A tensor-parallel rank (`rank` of `ranks`) holds, of each of those tensors, its slices as
// Megatron-LM splits a transformer (tensor_parallel/shard.h): its heads' rows of q/k/v, its
// columns of o_proj, its MLP columns, its vocabulary rows of an untied LM head.
// Plain value; thread-safe to read.
#ifndef LAMINA_COMPUTE_NODE_MODEL_WEIGHT_SHARE_H_
#define LAMINA_COMPUTE_NODE_MODEL_WEIGHT_SHARE_H_

#include <algorithm>
#include <cstdint>

#include "common/model_config/model_config.h"

namespace lamina {

struct WeightShare {
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // -1: to the model's last layer (the whole model, with first_layer 0)
  int rank = 0;            // a tensor-parallel rank of `ranks`; 1 rank: whole tensors
  int ranks = 1;

  int64_t End(const ModelConfig& c) const { return end_layer < 0 ? c.num_layers : end_layer; }
  // Input norm, q/k/v projection (and bias) of `layer`.
  bool HoldsAttentionIn(const ModelConfig& c, int64_t layer) const {
    return (layer == 0 && first_layer == 0) || (layer > first_layer && layer <= End(c));
  }
  // o_proj, post-attention norm, gate/up and down of `layer`.
  bool HoldsAttentionOut(const ModelConfig& c, int64_t layer) const {
    return layer >= first_layer && layer < End(c);
  }
  bool HoldsHead(const ModelConfig& c) const { return End(c) == c.num_layers; }
  // The layers whose attention this share runs (those it holds the attention-in half of):
  // [FirstAttentionLayer, EndAttentionLayer), empty for a last node of one layer.
  int64_t FirstAttentionLayer() const { return first_layer == 0 ? 0 : first_layer + 1; }
  int64_t EndAttentionLayer(const ModelConfig& c) const { return std::min(End(c) + 1, c.num_layers); }
  bool HoldsEmbedding(const ModelConfig& c) const {
    return first_layer == 0 || (c.tie_word_embeddings && HoldsHead(c));
  }
};

// What a tensor-parallel rank of `size` computes with: query heads, KV heads and the MLP's width
// divided by `size` (each must divide; CheckTensorParallel says so at start-up).
inline ModelConfig RankConfig(const ModelConfig& config, int size) {
  ModelConfig c = config;
  c.num_q_heads /= size;
  c.num_kv_heads /= size;
  c.intermediate_size /= size;
  return c;
}

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_MODEL_WEIGHT_SHARE_H_
