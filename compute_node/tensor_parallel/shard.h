// A tensor-parallel rank's share of a model, as Megatron-LM splits a transformer over `size`
// ranks: q/k/v and gate/up by output rows (whole heads, whole MLP columns), o_proj and down by
// input columns (their partial sums are all-reduced, RankGroup::AllReduceSum), an untied LM head
// by vocabulary rows (the logits all-gathered). Norms and the embedding stay whole.
// Pure functions; thread-compatible on the weights they change.
#ifndef LAMINA_COMPUTE_NODE_TENSOR_PARALLEL_SHARD_H_
#define LAMINA_COMPUTE_NODE_TENSOR_PARALLEL_SHARD_H_

#include "common/model_config/model_config.h"
#include "compute_node/model/model_weights.h"

namespace lamina {

// Keeps rank `rank`'s slices of whole weights `w` and sets w->config to RankConfig
// (model/weight_share.h): for weights drawn whole (random ones). A checkpoint's rank reads only
// its slices (ModelWeights::Load with a WeightShare of the rank), the same values.
void ShardWeights(int rank, int size, ModelWeights* w);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_TENSOR_PARALLEL_SHARD_H_
