#include "compute_node/engine/model_slices.h"

#include <cstring>

#include "common/status/status_macros.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"

namespace lamina {
namespace {

// Resizes a scratch tensor only when the batch shape changes.
void Ensure(Tensor* t, int64_t rows, int64_t cols) {
  if (t->rank() != 2 || t->dim(0) != rows || t->dim(1) != cols) t->Reshape({rows, cols});
}

}  // namespace

ModelSlices::ModelSlices(const ModelWeights* weights, ThreadPool* pool, RankGroup* group)
    : weights_(weights), pool_(pool), group_(group), rope_(weights->config.rope, weights->config.head_dim) {}

absl::Status ModelSlices::Reduce(Tensor* t) const {
  return group_ == nullptr ? absl::OkStatus() : group_->AllReduceSum(absl::MakeSpan(t->data(), t->size()));
}

QkvLayout ModelSlices::qkv_layout() const {
  const ModelConfig& c = config();
  return QkvLayout{c.qkv_size(), 0, c.q_size(), c.q_size() + c.kv_size()};
}

void ModelSlices::PreAttention(int64_t layer, SliceState* s) const {
  const ModelConfig& c = config();
  const LayerWeights& w = weights_->layers[layer];
  const int64_t n = s->residual.dim(0);
  Ensure(&s->normed, n, c.hidden_size);
  Ensure(&s->qkv, n, c.qkv_size());
  kernels::cpu::RmsNorm(s->residual.data(), w.input_norm.data(), s->normed.data(), n, c.hidden_size, c.rms_norm_eps);
  kernels::cpu::Matmul(s->normed.data(), w.qkv.data(), w.qkv_bias.size() ? w.qkv_bias.data() : nullptr,
                       s->qkv.data(), n, c.qkv_size(), c.hidden_size, *pool_);
  // q and k heads are contiguous at the start of each row: rotate q_heads + kv_heads heads.
  rope_.Apply(s->qkv.data(), s->positions.data(), n, c.num_q_heads + c.num_kv_heads, c.qkv_size());
}

absl::Status ModelSlices::PostAttention(int64_t layer, SliceState* s) const {
  const ModelConfig& c = config();
  const LayerWeights& w = weights_->layers[layer];
  const int64_t n = s->residual.dim(0);
  Ensure(&s->normed, n, c.hidden_size);  // a batch resumed here (rotation) starts with this slice
  Ensure(&s->projected, n, c.hidden_size);
  Ensure(&s->gate_up, n, 2 * c.intermediate_size);
  Ensure(&s->activated, n, c.intermediate_size);
  kernels::cpu::Matmul(s->attn_out.data(), w.o_proj.data(), nullptr, s->projected.data(), n,
                       c.hidden_size, c.q_size(), *pool_);
  LAMINA_RETURN_IF_ERROR(Reduce(&s->projected));
  kernels::cpu::AddInPlace(s->residual.data(), s->projected.data(), n * c.hidden_size);
  kernels::cpu::RmsNorm(s->residual.data(), w.post_norm.data(), s->normed.data(), n, c.hidden_size, c.rms_norm_eps);
  kernels::cpu::Matmul(s->normed.data(), w.gate_up.data(), nullptr, s->gate_up.data(), n,
                       2 * c.intermediate_size, c.hidden_size, *pool_);
  kernels::cpu::SwiGlu(s->gate_up.data(), s->activated.data(), n, c.intermediate_size);
  kernels::cpu::Matmul(s->activated.data(), w.down.data(), nullptr, s->projected.data(), n,
                       c.hidden_size, c.intermediate_size, *pool_);
  LAMINA_RETURN_IF_ERROR(Reduce(&s->projected));
  kernels::cpu::AddInPlace(s->residual.data(), s->projected.data(), n * c.hidden_size);
  return absl::OkStatus();
}

void ModelSlices::RunFirst(absl::Span<const int32_t> tokens, SliceState* s) const {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  Ensure(&s->residual, n, c.hidden_size);
  Ensure(&s->attn_out, n, c.q_size());
  kernels::cpu::Embedding(weights_->embed.data(), tokens.data(), s->residual.data(), n, c.hidden_size);
  PreAttention(0, s);
}

absl::Status ModelSlices::RunMiddle(int64_t slice, SliceState* s) const {
  LAMINA_RETURN_IF_ERROR(PostAttention(slice - 1, s));
  PreAttention(slice, s);
  return absl::OkStatus();
}

absl::Status ModelSlices::RunLast(absl::Span<const int64_t> rows, SliceState* s, Tensor* logits) const {
  const ModelConfig& c = config();
  LAMINA_RETURN_IF_ERROR(PostAttention(c.num_layers - 1, s));
  const int64_t n = static_cast<int64_t>(rows.size());
  // Only the rows that need logits go through the final norm and the (large) LM head.
  Tensor selected({n, c.hidden_size});
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(selected.row(i), s->residual.row(rows[i]), c.hidden_size * sizeof(float));
  }
  kernels::cpu::RmsNorm(selected.data(), weights_->final_norm.data(), selected.data(), n, c.hidden_size, c.rms_norm_eps);
  const int64_t head_rows = weights_->head().dim(0);  // the vocabulary, or this rank's slice of it
  Ensure(logits, n, c.vocab_size);
  if (head_rows == c.vocab_size) {
    kernels::cpu::Matmul(selected.data(), weights_->head().data(), nullptr, logits->data(), n, c.vocab_size,
                         c.hidden_size, *pool_);
    return absl::OkStatus();
  }
  if (group_ == nullptr || head_rows * group_->size() != c.vocab_size) {
    return absl::InternalError("an LM head slice without its tensor-parallel group");
  }
  Tensor part({n, head_rows});
  kernels::cpu::Matmul(selected.data(), weights_->head().data(), nullptr, part.data(), n, head_rows, c.hidden_size,
                       *pool_);
  // Gathered rank-major ([rank][row][vocab slice]); each row's logits are the ranks' slices in order.
  Tensor gathered({group_->size(), n, head_rows});
  LAMINA_RETURN_IF_ERROR(group_->AllGather(absl::MakeConstSpan(part.data(), part.size()),
                                           absl::MakeSpan(gathered.data(), gathered.size())));
  for (int r = 0; r < group_->size(); ++r) {
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(logits->row(i) + r * head_rows, gathered.data() + (r * n + i) * head_rows, head_rows * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace lamina
