// The model cut at its attention operators into num_layers + 1 slices (the paper's model
// splitter, its section 5.3). Attention itself is not part of any slice:
//   slice 0:           embedding, then layer 0 up to q/k/v (norm, projection, RoPE);
//   slice i (0<i<L):   the rest of layer i-1 (output projection, residual, MLP), then layer i up
//                      to q/k/v;
//   slice L:           the rest of layer L-1, the final norm and the LM head.
// As one rank of a tensor-parallel group (shard.h), the output projection's and the MLP's partial
// sums are all-reduced over the group before joining the residual stream, and the LM head's
// vocabulary slices are gathered, so every rank ends a slice with the whole model's values.
// Thread-compatible: a SliceState belongs to one batch; ModelSlices itself is immutable (its group
// serves one call at a time).
#ifndef LAMINA_COMPUTE_NODE_ENGINE_MODEL_SLICES_H_
#define LAMINA_COMPUTE_NODE_ENGINE_MODEL_SLICES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/attention/attention_service.h"
#include "common/tensor/tensor.h"
#include "common/threading/thread_pool.h"
#include "compute_node/model/model_weights.h"
#include "compute_node/tensor_parallel/rank_group.h"
#include "kernels/cpu/rope.h"

namespace lamina {

// A batch of tokens travelling through the slices.
struct SliceState {
  std::vector<int32_t> positions;  // [tokens]
  Tensor residual;                 // [tokens, hidden]: the residual stream x
  Tensor qkv;                      // [tokens, q_size + 2 kv_size]: ends a slice before attention
  Tensor attn_out;                 // [tokens, q_size]: attention output, starts the next slice
  // Scratch, kept between iterations so that steady-state decode allocates nothing.
  Tensor normed;                   // [tokens, hidden]
  Tensor projected;                // [tokens, hidden]
  Tensor gate_up;                  // [tokens, 2 * intermediate]
  Tensor activated;                // [tokens, intermediate]
};

class ModelSlices {
 public:
  // `group`: the tensor-parallel group this rank's `weights` belong to (null: the whole model).
  ModelSlices(const ModelWeights* weights, ThreadPool* pool, RankGroup* group = nullptr);

  int64_t num_slices() const { return config().num_layers + 1; }
  const ModelConfig& config() const { return weights_->config; }
  // Where q, k and v sit in SliceState::qkv.
  QkvLayout qkv_layout() const;

  // Slice 0. `tokens` must be inside the vocabulary; state->positions must be set.
  void RunFirst(absl::Span<const int32_t> tokens, SliceState* state) const;
  // Slice `slice`, 0 < slice < num_layers: reads attn_out, writes qkv. Fails only when the
  // group's collectives do.
  absl::Status RunMiddle(int64_t slice, SliceState* state) const;
  // The last slice: reads attn_out, writes logits [rows.size(), vocab] for the given token rows.
  absl::Status RunLast(absl::Span<const int64_t> rows, SliceState* state, Tensor* logits) const;

 private:
  void PreAttention(int64_t layer, SliceState* state) const;
  absl::Status PostAttention(int64_t layer, SliceState* state) const;
  // The group's sum of `t` (nothing without a group).
  absl::Status Reduce(Tensor* t) const;

  const ModelWeights* weights_;
  ThreadPool* pool_;
  RankGroup* group_;
  kernels::cpu::Rope rope_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_MODEL_SLICES_H_
