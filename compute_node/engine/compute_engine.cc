#include "compute_node/engine/compute_engine.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "kernels/cpu/attention.h"

namespace lamina {

ComputeEngine::ComputeEngine(const ModelWeights* weights, AttentionService* attention, ThreadPool* pool)
    : weights_(weights), attention_(attention), pool_(pool), slices_(weights, pool) {}

absl::Status ComputeEngine::CheckToken(int32_t token, int32_t position) const {
  if (token < 0 || token >= config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", token, " is outside the vocabulary (size ",
                                                   config().vocab_size, ")"));
  }
  if (position < 0 || position >= config().max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("position ", position, " is beyond the model's context of ",
                                                   config().max_position_embeddings, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status ComputeEngine::Prefill(absl::Span<const PrefillSequence> prompts, bool all_positions,
                                    Tensor* logits) {
  const ModelConfig& c = config();
  std::vector<int32_t> tokens;
  SliceState& s = prefill_state_;
  s.positions.clear();
  for (const PrefillSequence& p : prompts) {
    if (p.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", p.seq, ": empty prompt"));
    if (static_cast<int64_t>(p.tokens.size()) > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", p.seq, ": prompt of ", p.tokens.size(),
                                                     " tokens is longer than the model's context of ",
                                                     c.max_position_embeddings));
    }
    for (size_t t = 0; t < p.tokens.size(); ++t) {
      LAMINA_RETURN_IF_ERROR(CheckToken(p.tokens[t], static_cast<int32_t>(t)));
      s.positions.push_back(static_cast<int32_t>(t));
    }
    tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
  }
  auto free_all = [&] {
    for (const PrefillSequence& p : prompts) attention_->Free(p.seq);
  };
  std::vector<Reservation> reservations;
  for (const PrefillSequence& p : prompts) reservations.push_back({p.seq, static_cast<int32_t>(p.tokens.size())});
  LAMINA_RETURN_IF_ERROR(attention_->Reserve(reservations));

  const QkvLayout qkv = slices_.qkv_layout();
  const kernels::cpu::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window};
  slices_.RunFirst(tokens, &s);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    int64_t row = 0;
    for (const PrefillSequence& p : prompts) {
      const int64_t n = static_cast<int64_t>(p.tokens.size());
      const float* base = s.qkv.row(row);
      kernels::cpu::PrefillAttention(shape, base + qkv.q_offset, qkv.row_stride, base + qkv.k_offset,
                                     base + qkv.v_offset, qkv.row_stride, s.attn_out.row(row), c.q_size(),
                                     n, *pool_);
      absl::Status status = attention_->StoreKv(layer, p.seq, 0, n, base + qkv.k_offset,
                                                base + qkv.v_offset, qkv.row_stride);
      if (!status.ok()) {
        free_all();
        return status;
      }
      row += n;
    }
    if (layer + 1 < c.num_layers) slices_.RunMiddle(layer + 1, &s);
  }

  std::vector<int64_t> rows;
  if (all_positions) {
    for (int64_t r = 0; r < static_cast<int64_t>(tokens.size()); ++r) rows.push_back(r);
  } else {
    int64_t end = 0;
    for (const PrefillSequence& p : prompts) {
      end += static_cast<int64_t>(p.tokens.size());
      rows.push_back(end - 1);
    }
  }
  slices_.RunLast(rows, &s, logits);
  return absl::OkStatus();
}

absl::Status ComputeEngine::Decode(absl::Span<const DecodeToken> batch, Tensor* logits) {
  const ModelConfig& c = config();
  SliceState& s = decode_state_;
  s.positions.clear();
  entries_.clear();
  std::vector<int32_t> tokens;
  tokens.reserve(batch.size());
  for (const DecodeToken& t : batch) {
    LAMINA_RETURN_IF_ERROR(CheckToken(t.token, t.position));
    s.positions.push_back(t.position);
    entries_.push_back({t.seq, t.position});
    tokens.push_back(t.token);
  }
  std::vector<Reservation> reservations;
  for (const DecodeToken& t : batch) reservations.push_back({t.seq, t.position + 1});
  LAMINA_RETURN_IF_ERROR(attention_->Reserve(reservations));

  const QkvLayout qkv = slices_.qkv_layout();
  slices_.RunFirst(tokens, &s);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    LAMINA_RETURN_IF_ERROR(attention_->Decode(layer, entries_, s.qkv.data(), qkv, s.attn_out.data(), c.q_size()));
    if (layer + 1 < c.num_layers) slices_.RunMiddle(layer + 1, &s);
  }
  std::vector<int64_t> rows(batch.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  slices_.RunLast(rows, &s, logits);
  return absl::OkStatus();
}

}  // namespace lamina
