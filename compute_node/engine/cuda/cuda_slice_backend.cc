#include "compute_node/engine/cuda/cuda_slice_backend.h"

#include <algorithm>
#include <cstring>

#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"

namespace lamina {
namespace {

using bf16 = __nv_bfloat16;
namespace kc = kernels::cuda;

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSliceBackend>> CudaSliceBackend::Create(const CudaModelWeights* weights,
                                                                           int device) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<CudaSliceBackend> b(new CudaSliceBackend(weights, device));
  LAMINA_ASSIGN_OR_RETURN(b->stream_, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(b->gemm_, kc::Gemm::Create());
  return b;
}

QkvLayout CudaSliceBackend::qkv_layout() const {
  const ModelConfig& c = config();
  return QkvLayout{c.qkv_size(), 0, c.q_size(), c.q_size() + c.kv_size()};
}

absl::Status CudaSliceBackend::Reserve(int64_t tokens) {
  if (tokens <= capacity_) return absl::OkStatus();
  const ModelConfig& c = config();
  const int64_t n = std::max<int64_t>(tokens, 2 * capacity_);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));  // buffers may still be in use
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&tokens_, n * sizeof(int32_t)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&positions_, n * sizeof(int32_t)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&rows_, n * sizeof(int32_t)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&residual_, n * c.hidden_size * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(
      cuda::EnsureCapacity(&normed_, n * std::max(c.hidden_size, c.q_size()) * sizeof(bf16)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&qkv_, n * c.qkv_size() * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&attn_out_, n * c.q_size() * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&gate_up_, n * 2 * c.intermediate_size * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&activated_, n * c.intermediate_size * sizeof(bf16)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&selected_, n * c.hidden_size * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&logits_, n * c.vocab_size * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&host_qkv_, n * c.qkv_size() * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&host_attn_out_, n * c.q_size() * sizeof(float)));
  capacity_ = n;
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::SetBatch(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int64_t n = static_cast<int64_t>(tokens.size());
  LAMINA_RETURN_IF_ERROR(Reserve(n));
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(tokens_.data(), tokens.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(positions_.data(), positions.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  // The sources are pageable and may go away when this returns.
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  tokens_in_batch_ = n;
  attn_out_on_host_ = false;
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::PreAttention(int64_t layer) {
  const ModelConfig& c = config();
  const CudaLayerWeights& w = weights_->layers[layer];
  const int64_t n = tokens_in_batch_;
  LAMINA_RETURN_IF_ERROR(kc::RmsNorm(residual_.as<float>(), nullptr, w.input_norm.as<bf16>(), normed_.as<bf16>(), n,
                                     c.hidden_size, c.rms_norm_eps, stream()));
  LAMINA_RETURN_IF_ERROR(gemm_->Run(normed_.as<bf16>(), w.qkv.as<bf16>(),
                                    w.qkv_bias.bytes() ? w.qkv_bias.as<float>() : nullptr, qkv_.as<float>(), n,
                                    c.qkv_size(), c.hidden_size, false, stream()));
  // q and k heads are contiguous at the start of each row.
  return kc::Rope(qkv_.as<float>(), positions_.as<int32_t>(), weights_->rope.as<float>(), n,
                  c.num_q_heads + c.num_kv_heads, c.head_dim, c.qkv_size(), stream());
}

absl::Status CudaSliceBackend::PostAttention(int64_t layer) {
  const ModelConfig& c = config();
  const CudaLayerWeights& w = weights_->layers[layer];
  const int64_t n = tokens_in_batch_;
  LAMINA_RETURN_IF_ERROR(kc::ToBf16(attn_out_.as<float>(), normed_.as<bf16>(), n * c.q_size(), stream()));
  // The residual adds ride in the GEMM epilogues: x += o·Woᵀ, then x += down(...).
  LAMINA_RETURN_IF_ERROR(gemm_->Run(normed_.as<bf16>(), w.o_proj.as<bf16>(), nullptr, residual_.as<float>(), n,
                                    c.hidden_size, c.q_size(), true, stream()));
  LAMINA_RETURN_IF_ERROR(kc::RmsNorm(residual_.as<float>(), nullptr, w.post_norm.as<bf16>(), normed_.as<bf16>(), n,
                                     c.hidden_size, c.rms_norm_eps, stream()));
  LAMINA_RETURN_IF_ERROR(gemm_->Run(normed_.as<bf16>(), w.gate_up.as<bf16>(), nullptr, gate_up_.as<float>(), n,
                                    2 * c.intermediate_size, c.hidden_size, false, stream()));
  LAMINA_RETURN_IF_ERROR(kc::SwiGlu(gate_up_.as<float>(), activated_.as<bf16>(), n, c.intermediate_size, stream()));
  return gemm_->Run(activated_.as<bf16>(), w.down.as<bf16>(), nullptr, residual_.as<float>(), n, c.hidden_size,
                    c.intermediate_size, true, stream());
}

absl::Status CudaSliceBackend::EmbedAndProject() {
  const ModelConfig& c = config();
  LAMINA_RETURN_IF_ERROR(kc::Embedding(weights_->embed.as<bf16>(), tokens_.as<int32_t>(), residual_.as<float>(),
                                       tokens_in_batch_, c.hidden_size, stream()));
  return PreAttention(0);
}

absl::Status CudaSliceBackend::Middle(int64_t slice) {
  LAMINA_RETURN_IF_ERROR(PostAttention(slice - 1));
  return PreAttention(slice);
}

absl::Status CudaSliceBackend::FinalNormAndHead(int64_t rows) {
  const ModelConfig& c = config();
  LAMINA_RETURN_IF_ERROR(kc::RmsNorm(selected_.as<float>(), nullptr, weights_->final_norm.as<bf16>(),
                                     normed_.as<bf16>(), rows, c.hidden_size, c.rms_norm_eps, stream()));
  return gemm_->Run(normed_.as<bf16>(), weights_->head(), nullptr, logits_.as<float>(), rows, c.vocab_size,
                    c.hidden_size, false, stream());
}

absl::Status CudaSliceBackend::LogitsForAllRows() {
  const ModelConfig& c = config();
  LAMINA_RETURN_IF_ERROR(PostAttention(c.num_layers - 1));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(selected_.data(), residual_.data(),
                                              tokens_in_batch_ * c.hidden_size * sizeof(float),
                                              cudaMemcpyDeviceToDevice, stream()));
  return FinalNormAndHead(tokens_in_batch_);
}

absl::Status CudaSliceBackend::RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) {
  LAMINA_RETURN_IF_ERROR(SetBatch(tokens, positions));
  return EmbedAndProject();
}

absl::Status CudaSliceBackend::UploadAttnOutIfOnHost() {
  if (!attn_out_on_host_) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(attn_out_.data(), host_attn_out_.as<float>(),
                                              tokens_in_batch_ * config().q_size() * sizeof(float),
                                              cudaMemcpyHostToDevice, stream()));
  attn_out_on_host_ = false;
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::RunMiddle(int64_t slice) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  LAMINA_RETURN_IF_ERROR(UploadAttnOutIfOnHost());
  return Middle(slice);
}

absl::Status CudaSliceBackend::RunLast(absl::Span<const int64_t> rows, Tensor* logits) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const ModelConfig& c = config();
  LAMINA_RETURN_IF_ERROR(UploadAttnOutIfOnHost());
  LAMINA_RETURN_IF_ERROR(PostAttention(c.num_layers - 1));
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int32_t> rows32(rows.begin(), rows.end());
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(rows_.data(), rows32.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  LAMINA_RETURN_IF_ERROR(kc::GatherRows(residual_.as<float>(), rows_.as<int32_t>(), selected_.as<float>(), n,
                                        c.hidden_size, stream()));
  LAMINA_RETURN_IF_ERROR(FinalNormAndHead(n));
  if (logits->rank() != 2 || logits->dim(0) != n || logits->dim(1) != c.vocab_size) logits->Reshape({n, c.vocab_size});
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), logits_.data(), n * c.vocab_size * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaSliceBackend::HostQkv() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_qkv_.as<float>(), qkv_.data(),
                                              tokens_in_batch_ * config().qkv_size() * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  return host_qkv_.as<float>();
}

float* CudaSliceBackend::HostAttnOut() {
  attn_out_on_host_ = true;
  return host_attn_out_.as<float>();
}

absl::Status CudaSliceBackend::PrefillAttention(int64_t first_row, int64_t count) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const ModelConfig& c = config();
  const kc::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window};
  const float* base = qkv_.as<float>() + first_row * c.qkv_size();
  attn_out_on_host_ = false;
  return kc::PrefillAttention(shape, base, c.qkv_size(), base + c.q_size(), base + c.q_size() + c.kv_size(),
                              c.qkv_size(), attn_out_.as<float>() + first_row * c.q_size(), c.q_size(), count,
                              stream());
}

}  // namespace lamina
