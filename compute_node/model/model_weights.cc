#include "compute_node/model/model_weights.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/safetensors/checkpoint.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

// Stacks several [rows_i, cols] tensors into one [sum rows_i, cols] tensor.
Tensor StackRows(std::vector<Tensor> parts) {
  int64_t rows = 0;
  std::vector<int64_t> shape = parts[0].shape();
  for (const Tensor& p : parts) rows += p.dim(0);
  shape[0] = rows;
  Tensor out(shape);
  float* dst = out.data();
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.data(), p.size() * sizeof(float));
    dst += p.size();
  }
  return out;
}

// A layer's input norm, q/k/v projection and bias (`p`: its tensors' prefix), or a
// tensor-parallel rank's heads of them.
absl::Status LoadAttentionIn(const Checkpoint& ckpt, const ModelConfig& c, const WeightShare& share,
                             const std::string& p, LayerWeights* w) {
  const int64_t h = c.hidden_size;
  const ModelConfig part = RankConfig(c, share.ranks);
  const int64_t q = part.q_size(), kv = part.kv_size();
  LAMINA_ASSIGN_OR_RETURN(w->input_norm, ckpt.ReadFloat32(p + "input_layernorm.weight", {h}));
  std::vector<Tensor> qkv(3);
  LAMINA_ASSIGN_OR_RETURN(qkv[0], ckpt.ReadFloat32Rows(p + "self_attn.q_proj.weight", {c.q_size(), h}, share.rank * q, q));
  LAMINA_ASSIGN_OR_RETURN(qkv[1], ckpt.ReadFloat32Rows(p + "self_attn.k_proj.weight", {c.kv_size(), h}, share.rank * kv, kv));
  LAMINA_ASSIGN_OR_RETURN(qkv[2], ckpt.ReadFloat32Rows(p + "self_attn.v_proj.weight", {c.kv_size(), h}, share.rank * kv, kv));
  w->qkv = StackRows(std::move(qkv));
  if (c.attention_bias) {
    std::vector<Tensor> bias(3);
    LAMINA_ASSIGN_OR_RETURN(bias[0], ckpt.ReadFloat32Rows(p + "self_attn.q_proj.bias", {c.q_size()}, share.rank * q, q));
    LAMINA_ASSIGN_OR_RETURN(bias[1], ckpt.ReadFloat32Rows(p + "self_attn.k_proj.bias", {c.kv_size()}, share.rank * kv, kv));
    LAMINA_ASSIGN_OR_RETURN(bias[2], ckpt.ReadFloat32Rows(p + "self_attn.v_proj.bias", {c.kv_size()}, share.rank * kv, kv));
    w->qkv_bias = StackRows(std::move(bias));
  }
  return absl::OkStatus();
}

// A layer's o_proj, post-attention norm and MLP, or a tensor-parallel rank's columns of them.
absl::Status LoadAttentionOut(const Checkpoint& ckpt, const ModelConfig& c, const WeightShare& share,
                              const std::string& p, LayerWeights* w) {
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const ModelConfig part = RankConfig(c, share.ranks);
  const int64_t q = part.q_size(), mine = part.intermediate_size;
  LAMINA_ASSIGN_OR_RETURN(w->o_proj, ckpt.ReadFloat32Columns(p + "self_attn.o_proj.weight", {h, c.q_size()},
                                                             share.rank * q, q));
  LAMINA_ASSIGN_OR_RETURN(w->post_norm, ckpt.ReadFloat32(p + "post_attention_layernorm.weight", {h}));
  std::vector<Tensor> gate_up(2);
  LAMINA_ASSIGN_OR_RETURN(gate_up[0], ckpt.ReadFloat32Rows(p + "mlp.gate_proj.weight", {inter, h}, share.rank * mine, mine));
  LAMINA_ASSIGN_OR_RETURN(gate_up[1], ckpt.ReadFloat32Rows(p + "mlp.up_proj.weight", {inter, h}, share.rank * mine, mine));
  w->gate_up = StackRows(std::move(gate_up));
  LAMINA_ASSIGN_OR_RETURN(w->down, ckpt.ReadFloat32Columns(p + "mlp.down_proj.weight", {h, inter}, share.rank * mine, mine));
  return absl::OkStatus();
}

uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The formula of kernels::cuda::FillUniform, element by element.
Tensor RandomTensor(std::vector<int64_t> shape, float scale, uint64_t seed) {
  Tensor t(std::move(shape));
  float* data = t.data();
  for (int64_t i = 0; i < t.size(); ++i) {
    const float u =
        static_cast<float>(SplitMix64(seed ^ (static_cast<uint64_t>(i) * 0x2545f4914f6cdd1dull)) >> 40) * 0x1p-24f;
    data[i] = (2.f * u - 1.f) * scale;
  }
  return t;
}

}  // namespace

std::unique_ptr<ModelWeights> ModelWeights::Random(const ModelConfig& config, uint64_t seed, const WeightShare& share) {
  auto w = std::make_unique<ModelWeights>();
  w->config = config;
  w->config.tie_word_embeddings = false;
  w->config.attention_bias = false;
  const ModelConfig& c = w->config;
  const int64_t h = c.hidden_size;
  const float proj = 1.f / std::sqrt(static_cast<float>(h));
  const float down = 1.f / std::sqrt(static_cast<float>(c.intermediate_size));
  uint64_t stream = seed;  // one stream per tensor, in CudaModelWeights::Random's order
  // The next stream's tensor when `held`, else empty (its stream skipped all the same).
  auto draw = [&](bool held, std::vector<int64_t> shape, float scale) {
    ++stream;
    return held ? RandomTensor(std::move(shape), scale, stream) : Tensor();
  };
  w->embed = draw(share.HoldsEmbedding(c), {c.vocab_size, h}, 1.f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool in = share.HoldsAttentionIn(c, l), out = share.HoldsAttentionOut(c, l);
    LayerWeights layer;
    layer.input_norm = draw(in, {h}, 1.f);
    layer.qkv = draw(in, {c.qkv_size(), h}, proj);
    layer.o_proj = draw(out, {h, c.q_size()}, proj);
    layer.post_norm = draw(out, {h}, 1.f);
    layer.gate_up = draw(out, {2 * c.intermediate_size, h}, proj);
    layer.down = draw(out, {h, c.intermediate_size}, down);
    w->layers.push_back(std::move(layer));
  }
  w->final_norm = draw(share.HoldsHead(c), {h}, 1.f);
  w->lm_head = draw(share.HoldsHead(c), {c.vocab_size, h}, proj);
  return w;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& dir, const WeightShare& share) {
  auto weights = std::make_unique<ModelWeights>();
  LAMINA_ASSIGN_OR_RETURN(weights->config, LoadModelConfig(dir));
  const ModelConfig& c = weights->config;
  LAMINA_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(dir));
  if (share.HoldsEmbedding(c)) {
    LAMINA_ASSIGN_OR_RETURN(weights->embed,
                            ckpt.ReadFloat32("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string prefix = absl::StrCat("model.layers.", l, ".");
    LayerWeights layer;
    if (share.HoldsAttentionIn(c, l)) LAMINA_RETURN_IF_ERROR(LoadAttentionIn(ckpt, c, share, prefix, &layer));
    if (share.HoldsAttentionOut(c, l)) LAMINA_RETURN_IF_ERROR(LoadAttentionOut(ckpt, c, share, prefix, &layer));
    weights->layers.push_back(std::move(layer));
  }
  if (share.HoldsHead(c)) {
    LAMINA_ASSIGN_OR_RETURN(weights->final_norm, ckpt.ReadFloat32("model.norm.weight", {c.hidden_size}));
    if (!c.tie_word_embeddings) {
      const int64_t vocab = c.vocab_size / share.ranks;
      LAMINA_ASSIGN_OR_RETURN(weights->lm_head, ckpt.ReadFloat32Rows("lm_head.weight", {c.vocab_size, c.hidden_size},
                                                                     share.rank * vocab, vocab));
    }
  }
  weights->config = RankConfig(c, share.ranks);
  return weights;
}

}  // namespace lamina
