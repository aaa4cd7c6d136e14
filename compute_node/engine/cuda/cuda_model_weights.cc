#include "compute_node/engine/cuda/cuda_model_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/safetensors/checkpoint.h"
#include "common/status/status_macros.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/elementwise.h"

namespace lamina {
namespace {

using bf16 = __nv_bfloat16;

absl::StatusOr<cuda::DeviceBuffer> Allocate(size_t bytes, const std::string& name) {
  absl::StatusOr<cuda::DeviceBuffer> buffer = cuda::DeviceBuffer::Create(bytes);
  if (!buffer.ok()) return absl::Status(buffer.status().code(), absl::StrCat(name, ": ", buffer.status().message()));
  return buffer;
}

// An empty tensor (one a WeightShare leaves out) stays an empty buffer.
absl::StatusOr<cuda::DeviceBuffer> UploadBf16(const Tensor& t, const std::string& name) {
  if (t.size() == 0) return cuda::DeviceBuffer();
  std::vector<bf16> host(t.size());
  for (int64_t i = 0; i < t.size(); ++i) host[i] = __float2bfloat16(t.data()[i]);
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer buffer, Allocate(host.size() * sizeof(bf16), name));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer.data(), host.data(), buffer.bytes(), cudaMemcpyHostToDevice));
  return buffer;
}

absl::StatusOr<cuda::DeviceBuffer> UploadFloat(const Tensor& t, const std::string& name) {
  if (t.size() == 0) return cuda::DeviceBuffer();
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer buffer, Allocate(t.size() * sizeof(float), name));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer.data(), t.data(), buffer.bytes(), cudaMemcpyHostToDevice));
  return buffer;
}

absl::StatusOr<cuda::DeviceBuffer> RandomBf16(int64_t count, float scale, uint64_t seed, const std::string& name) {
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer buffer, Allocate(count * sizeof(bf16), name));
  LAMINA_RETURN_IF_ERROR(kernels::cuda::FillUniform(buffer.as<bf16>(), count, scale, seed, nullptr));
  return buffer;
}

// Pieces a float32 or float16 tensor is rounded to bf16 in, on the host.
constexpr int64_t kStageElements = int64_t{8} << 20;

// Checkpoint tensor `name` of `shape` into `dst` (bf16, on the device): a bf16 tensor's bytes as
// they are, another's rounded as UploadBf16 rounds them.
absl::Status CopyBf16(const Checkpoint& checkpoint, const std::string& name, const std::vector<int64_t>& shape,
                      bf16* dst) {
  LAMINA_ASSIGN_OR_RETURN(TensorView view, checkpoint.GetWeight(name, shape));
  const int64_t count = view.NumElements();
  if (view.dtype == DType::kBF16) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, view.data, count * sizeof(bf16), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  std::vector<float> wide(std::min(count, kStageElements));
  std::vector<bf16> narrow(wide.size());
  const size_t element = DTypeSize(view.dtype);
  for (int64_t first = 0; first < count; first += kStageElements) {
    const int64_t n = std::min(kStageElements, count - first);
    ConvertToFloat32(view.dtype, view.data + first * element, static_cast<size_t>(n), wide.data());
    for (int64_t i = 0; i < n; ++i) narrow[i] = __float2bfloat16(wide[i]);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst + first, narrow.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

// Several checkpoint tensors of `rows` rows each and `cols` columns, stacked into one new buffer.
absl::StatusOr<cuda::DeviceBuffer> LoadStacked(const Checkpoint& checkpoint, const std::vector<std::string>& names,
                                               const std::vector<int64_t>& rows, int64_t cols, const std::string& label) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer buffer, Allocate(total * cols * sizeof(bf16), label));
  bf16* dst = buffer.as<bf16>();
  for (size_t i = 0; i < names.size(); ++i) {
    const std::vector<int64_t> shape = cols == 1 ? std::vector<int64_t>{rows[i]} : std::vector<int64_t>{rows[i], cols};
    LAMINA_RETURN_IF_ERROR(CopyBf16(checkpoint, names[i], shape, dst));
    dst += rows[i] * cols;
  }
  return buffer;
}

absl::Status UploadRope(const ModelConfig& c, CudaModelWeights* w) {
  const kernels::cpu::Rope rope(c.rope, c.head_dim);
  const std::vector<float> table = kernels::cuda::RopeCosSin(rope.inv_freq(), c.max_position_embeddings);
  LAMINA_ASSIGN_OR_RETURN(w->rope, Allocate(table.size() * sizeof(float), "rope table"));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(w->rope.data(), table.data(), w->rope.bytes(), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

}  // namespace

int64_t CudaModelWeights::StepBytes() const {
  int64_t bytes = final_norm.bytes() + (lm_head.bytes() ? lm_head.bytes() : embed.bytes());
  for (const CudaLayerWeights& l : layers) {
    bytes += l.input_norm.bytes() + l.qkv.bytes() + l.qkv_bias.bytes() + l.o_proj.bytes() + l.post_norm.bytes() +
             l.gate_up.bytes() + l.down.bytes();
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<CudaModelWeights>> CudaModelWeights::Load(const std::string& model_dir,
                                                                         const WeightShare& share) {
  auto w = std::make_unique<CudaModelWeights>();
  LAMINA_ASSIGN_OR_RETURN(w->config, LoadModelConfig(model_dir));
  LAMINA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(model_dir));
  const ModelConfig& c = w->config;
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  auto one = [&](const std::string& name, int64_t rows, int64_t cols, const std::string& label) {
    return LoadStacked(checkpoint, {name}, {rows}, cols, label);
  };
  if (share.HoldsEmbedding(c)) {
    LAMINA_ASSIGN_OR_RETURN(w->embed, one("model.embed_tokens.weight", c.vocab_size, h, "embed_tokens"));
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, "."), name = absl::StrCat("layer ", i);
    CudaLayerWeights d;
    if (share.HoldsAttentionIn(c, i)) {
      LAMINA_ASSIGN_OR_RETURN(d.input_norm, one(p + "input_layernorm.weight", h, 1, name + " input_layernorm"));
      LAMINA_ASSIGN_OR_RETURN(d.qkv, LoadStacked(checkpoint,
                                                 {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                                                  p + "self_attn.v_proj.weight"},
                                                 {c.q_size(), c.kv_size(), c.kv_size()}, h, name + " qkv_proj"));
      if (c.attention_bias) {
        std::vector<float> bias;
        for (const char* part : {"q", "k", "v"}) {
          const std::string tensor = absl::StrCat(p, "self_attn.", part, "_proj.bias");
          LAMINA_ASSIGN_OR_RETURN(Tensor t,
                                  checkpoint.ReadFloat32(tensor, {part[0] == 'q' ? c.q_size() : c.kv_size()}));
          bias.insert(bias.end(), t.data(), t.data() + t.size());
        }
        LAMINA_ASSIGN_OR_RETURN(d.qkv_bias, Allocate(bias.size() * sizeof(float), name + " qkv bias"));
        LAMINA_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(d.qkv_bias.data(), bias.data(), d.qkv_bias.bytes(), cudaMemcpyHostToDevice));
      }
    }
    if (share.HoldsAttentionOut(c, i)) {
      LAMINA_ASSIGN_OR_RETURN(d.o_proj, one(p + "self_attn.o_proj.weight", h, c.q_size(), name + " o_proj"));
      LAMINA_ASSIGN_OR_RETURN(d.post_norm,
                              one(p + "post_attention_layernorm.weight", h, 1, name + " post_attention_layernorm"));
      LAMINA_ASSIGN_OR_RETURN(d.gate_up,
                              LoadStacked(checkpoint, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
                                          {inter, inter}, h, name + " gate_up_proj"));
      LAMINA_ASSIGN_OR_RETURN(d.down, one(p + "mlp.down_proj.weight", h, inter, name + " down_proj"));
    }
    w->layers.push_back(std::move(d));
  }
  if (share.HoldsHead(c)) {
    LAMINA_ASSIGN_OR_RETURN(w->final_norm, one("model.norm.weight", h, 1, "norm"));
    if (!c.tie_word_embeddings) {
      LAMINA_ASSIGN_OR_RETURN(w->lm_head, one("lm_head.weight", c.vocab_size, h, "lm_head"));
    }
  }
  LAMINA_RETURN_IF_ERROR(UploadRope(c, w.get()));
  return w;
}

absl::StatusOr<std::unique_ptr<CudaModelWeights>> CudaModelWeights::Upload(const ModelWeights& weights) {
  auto w = std::make_unique<CudaModelWeights>();
  w->config = weights.config;
  LAMINA_ASSIGN_OR_RETURN(w->embed, UploadBf16(weights.embed, "embed_tokens"));
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& l = weights.layers[i];
    const std::string name = absl::StrCat("layer ", i);
    CudaLayerWeights d;
    LAMINA_ASSIGN_OR_RETURN(d.input_norm, UploadBf16(l.input_norm, name + " input_layernorm"));
    LAMINA_ASSIGN_OR_RETURN(d.qkv, UploadBf16(l.qkv, name + " qkv_proj"));
    if (l.qkv_bias.size() > 0) {
      LAMINA_ASSIGN_OR_RETURN(d.qkv_bias, UploadFloat(l.qkv_bias, name + " qkv bias"));
    }
    LAMINA_ASSIGN_OR_RETURN(d.o_proj, UploadBf16(l.o_proj, name + " o_proj"));
    LAMINA_ASSIGN_OR_RETURN(d.post_norm, UploadBf16(l.post_norm, name + " post_attention_layernorm"));
    LAMINA_ASSIGN_OR_RETURN(d.gate_up, UploadBf16(l.gate_up, name + " gate_up_proj"));
    LAMINA_ASSIGN_OR_RETURN(d.down, UploadBf16(l.down, name + " down_proj"));
    w->layers.push_back(std::move(d));
  }
  LAMINA_ASSIGN_OR_RETURN(w->final_norm, UploadBf16(weights.final_norm, "norm"));
  if (weights.lm_head.size() > 0) {
    LAMINA_ASSIGN_OR_RETURN(w->lm_head, UploadBf16(weights.lm_head, "lm_head"));
  }
  LAMINA_RETURN_IF_ERROR(UploadRope(w->config, w.get()));
  return w;
}

absl::StatusOr<std::unique_ptr<CudaModelWeights>> CudaModelWeights::Random(const ModelConfig& c, uint64_t seed,
                                                                           const WeightShare& share) {
  auto w = std::make_unique<CudaModelWeights>();
  w->config = c;
  uint64_t stream = seed;
  // Scales keep activations of a deep random model finite: about 1/sqrt(fan_in).
  const float proj = 1.f / std::sqrt(static_cast<float>(c.hidden_size));
  const float down = 1.f / std::sqrt(static_cast<float>(c.intermediate_size));
  // The next stream's tensor when `held`, else an empty buffer (its stream skipped all the same).
  auto draw = [&](bool held, int64_t count, float scale, const char* name) -> absl::StatusOr<cuda::DeviceBuffer> {
    ++stream;
    if (!held) return cuda::DeviceBuffer();
    return RandomBf16(count, scale, stream, name);
  };
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  LAMINA_ASSIGN_OR_RETURN(w->embed, draw(share.HoldsEmbedding(c), c.vocab_size * h, 1.f, "embed_tokens"));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool in = share.HoldsAttentionIn(c, i), out = share.HoldsAttentionOut(c, i);
    CudaLayerWeights d;
    LAMINA_ASSIGN_OR_RETURN(d.input_norm, draw(in, h, 1.f, "input_layernorm"));
    LAMINA_ASSIGN_OR_RETURN(d.qkv, draw(in, c.qkv_size() * h, proj, "qkv_proj"));
    LAMINA_ASSIGN_OR_RETURN(d.o_proj, draw(out, h * c.q_size(), proj, "o_proj"));
    LAMINA_ASSIGN_OR_RETURN(d.post_norm, draw(out, h, 1.f, "post_attention_layernorm"));
    LAMINA_ASSIGN_OR_RETURN(d.gate_up, draw(out, 2 * inter * h, proj, "gate_up"));
    LAMINA_ASSIGN_OR_RETURN(d.down, draw(out, h * inter, down, "down_proj"));
    w->layers.push_back(std::move(d));
  }
  LAMINA_ASSIGN_OR_RETURN(w->final_norm, draw(share.HoldsHead(c), h, 1.f, "norm"));
  LAMINA_ASSIGN_OR_RETURN(w->lm_head, draw(share.HoldsHead(c), c.vocab_size * h, proj, "lm_head"));
  LAMINA_RETURN_IF_ERROR(UploadRope(c, w.get()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return w;
}

}  // namespace lamina
