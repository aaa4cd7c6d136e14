#include "compute_node/engine/cuda/cuda_slice_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"
#include "compute_node/sampling/penalties.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/logprobs.h"
#include "kernels/cuda/penalties.h"
#include "kernels/cuda/sampling.h"

namespace lamina {
namespace {

using bf16 = __nv_bfloat16;
namespace kc = kernels::cuda;

constexpr int64_t kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
constexpr int64_t kLargestBucket = kBuckets[sizeof(kBuckets) / sizeof(kBuckets[0]) - 1];

// Rows up to which the products' algorithms are chosen when a backend is made (Gemm::Prepare):
// past a step's usual token budget; larger steps reuse the largest. The LM head runs on the rows
// sampled in a step (at most the batch), or on every row (LogitsForAllRows), which then reuses
// the largest; its smaller limit also bounds Prepare's trial run of it (rows × vocabulary floats).
constexpr int64_t kPreparedRows = 16384;
constexpr int64_t kPreparedHeadRows = 1024;

// The shapes of the layers' products (PreAttention, PostAttention), with the weights they run with.
std::vector<kc::GemmShape> LayerProductShapes(const CudaModelWeights& w) {
  const ModelConfig& c = w.config;
  // Each product's weights from the first layer that holds them (a layer split's share may not).
  bool qkv_bias = false;
  for (const CudaLayerWeights& l : w.layers) qkv_bias |= l.qkv_bias.bytes() > 0;
  auto of = [&w](cuda::DeviceBuffer CudaLayerWeights::*member) -> const bf16* {
    for (const CudaLayerWeights& l : w.layers) {
      if ((l.*member).bytes() > 0) return (l.*member).as<bf16>();
    }
    return nullptr;
  };
  return {{c.qkv_size(), c.hidden_size, qkv_bias, false, of(&CudaLayerWeights::qkv)},
          {c.hidden_size, c.q_size(), false, true, of(&CudaLayerWeights::o_proj)},
          {2 * c.intermediate_size, c.hidden_size, false, false, of(&CudaLayerWeights::gate_up)},
          {c.hidden_size, c.intermediate_size, false, true, of(&CudaLayerWeights::down)}};
}

// The LM head's product (FinalNormAndHead).
kc::GemmShape HeadShape(const CudaModelWeights& w) {
  return {w.config.vocab_size, w.config.hidden_size, false, false, w.head()};
}

// The padded size a batch of n tokens runs at as graphs; 0 above the largest bucket.
int64_t GraphBucket(int64_t n) {
  for (int64_t b : kBuckets) {
    if (n <= b) return b;
  }
  return 0;
}

// The most units of work (QueuePacer: an exchange and the slice before it, or a prompt's
// attention) the backend queues ahead of its GPU. A layer of a decode step is one or two units; a
// unit is at most a few tens of launches, so 16 stay well within a stream's thousand or so.
constexpr int kMostQueuedUnits = 16;

}  // namespace

absl::StatusOr<std::unique_ptr<CudaSliceBackend>> CudaSliceBackend::Create(const CudaModelWeights* weights,
                                                                           int device, bool graphs) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<CudaSliceBackend> b(new CudaSliceBackend(weights, device, graphs));
  LAMINA_ASSIGN_OR_RETURN(b->stream_, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(b->gemm_, kc::Gemm::Create());
  LAMINA_ASSIGN_OR_RETURN(b->pacer_, cuda::QueuePacer::Create(kMostQueuedUnits));
  // Every algorithm the products will need, chosen and run once now: later, a device link's waits
  // may be spinning on the GPU, and choosing or first running one loads kernels, which waits for
  // them (gemm.h).
  LAMINA_RETURN_IF_ERROR(b->gemm_->Prepare(LayerProductShapes(*weights), kPreparedRows));
  LAMINA_RETURN_IF_ERROR(b->gemm_->Prepare({HeadShape(*weights)}, kPreparedHeadRows));
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
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&tokens_, n * sizeof(int32_t), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&positions_, n * sizeof(int32_t), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&rows_, n * sizeof(int32_t), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&residual_, n * c.hidden_size * sizeof(float), stream()));
  LAMINA_RETURN_IF_ERROR(
      cuda::EnsureCapacityOnStream(&normed_, n * std::max(c.hidden_size, c.q_size()) * sizeof(bf16), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&qkv_, n * c.qkv_size() * sizeof(float), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&attn_out_, n * c.q_size() * sizeof(float), stream()));
  LAMINA_RETURN_IF_ERROR(
      cuda::EnsureCapacityOnStream(&gate_up_, n * 2 * c.intermediate_size * sizeof(float), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&activated_, n * c.intermediate_size * sizeof(bf16), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&selected_, n * c.hidden_size * sizeof(float), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&logits_, n * c.vocab_size * sizeof(float), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_tokens_, n * sizeof(int32_t), &retired_host_));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_positions_, n * sizeof(int32_t), &retired_host_));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_qkv_, n * c.qkv_size() * sizeof(float), &retired_host_));
  LAMINA_RETURN_IF_ERROR(
      cuda::EnsureCapacityKeepingOld(&host_attn_out_, n * c.q_size() * sizeof(float), &retired_host_));
  // Padding rows read these before anything is written there: keep them finite.
  std::memset(host_attn_out_.data(), 0, host_attn_out_.bytes());
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(attn_out_.data(), 0, attn_out_.bytes(), stream()));
  capacity_ = n;
  graphs_.clear();  // they hold the old buffers' addresses
  step_graphs_.clear();
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::QueuePositions(absl::Span<const int32_t> positions) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_.data(), positions.data(), positions.size() * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream()));
  return absl::OkStatus();
}

void CudaSliceBackend::BeginPass(int64_t rows) {
  tokens_in_batch_ = padded_ = rows;
  graphed_ = attn_out_on_host_ = qkv_staged_ = logits_ready_ = false;
}

absl::StatusOr<int64_t> CudaSliceBackend::BeginLocalStep(absl::Span<const int32_t> tokens,
                                                         absl::Span<const int32_t> positions) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (busy_ != nullptr) {
    clock_.Clear();
    LAMINA_RETURN_IF_ERROR(clock_.Mark(true, stream()));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t bucket = use_graphs_ ? GraphBucket(n) : 0;
  // Room for every bucket at once, so that a larger batch does not move the buffers that the
  // smaller buckets' graphs use.
  LAMINA_RETURN_IF_ERROR(Reserve(bucket > 0 ? kLargestBucket : n));
  // The staging buffers may still feed an abandoned batch's copies.
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  const int64_t rows = bucket > 0 ? bucket : n;
  int32_t* host_tokens = host_tokens_.as<int32_t>();
  int32_t* host_positions = host_positions_.as<int32_t>();
  std::copy(tokens.begin(), tokens.end(), host_tokens);
  std::copy(positions.begin(), positions.end(), host_positions);
  std::fill(host_tokens + n, host_tokens + rows, 0);
  std::fill(host_positions + n, host_positions + rows, 0);
  BeginPass(n);
  padded_ = rows;
  graphed_ = bucket > 0;
  return rows;
}

absl::Status CudaSliceBackend::RunLocalStep(uint64_t attention_key, LayerAttention attention) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const ModelConfig& c = config();
  auto step = [&]() -> absl::Status {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens_.data(), host_tokens_.data(), padded_ * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_.data(), host_positions_.data(),
                                                padded_ * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
    LAMINA_RETURN_IF_ERROR(EmbedAndProject());
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      LAMINA_RETURN_IF_ERROR(attention(layer));
      if (layer + 1 < c.num_layers) LAMINA_RETURN_IF_ERROR(Middle(layer + 1));
    }
    return LogitsForAllRows();
  };
  if (!graphed_) {
    LAMINA_RETURN_IF_ERROR(step());
    logits_ready_ = true;
    return absl::OkStatus();
  }
  const auto key = std::make_pair(padded_, attention_key);
  if (auto it = step_graphs_.find(key); it != step_graphs_.end()) {
    LAMINA_RETURN_IF_ERROR(it->second.Launch(stream()));
    logits_ready_ = true;
    return absl::OkStatus();
  }
  // The first run is eager (see RunGraphed), then the step is captured for next time.
  LAMINA_RETURN_IF_ERROR(step());
  logits_ready_ = true;
  absl::StatusOr<cuda::Graph> graph = cuda::Graph::Capture(stream(), step);
  if (!graph.ok()) {
    std::fprintf(stderr, "CUDA graph capture failed, decoding without graphs from now on: %s\n",
                 std::string(graph.status().message()).c_str());
    use_graphs_ = false;
    return absl::OkStatus();
  }
  if (step_graphs_.size() >= kMostStepGraphs) step_graphs_.clear();
  step_graphs_.emplace(key, *std::move(graph));
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::SetBatch(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int64_t n = static_cast<int64_t>(tokens.size());
  LAMINA_RETURN_IF_ERROR(Reserve(n));
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(tokens_.data(), tokens.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  LAMINA_RETURN_IF_ERROR(QueuePositions(positions));
  // The sources are pageable and may go away when this returns.
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  BeginPass(n);
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::RunGraphed(int64_t slice, absl::FunctionRef<absl::Status()> work) {
  const auto key = std::make_tuple(padded_, slice, attention_on_device_);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second.Launch(stream());
  // The first run is eager: it gives this call its results and settles GEMM plans and kernel
  // loading before a capture, which must not do either.
  LAMINA_RETURN_IF_ERROR(work());
  if (!use_graphs_) return absl::OkStatus();  // a capture failed earlier
  absl::StatusOr<cuda::Graph> graph = cuda::Graph::Capture(stream(), work);
  if (!graph.ok()) {
    // This call's work is done; later batches run eagerly rather than fail.
    std::fprintf(stderr, "CUDA graph capture failed, decoding without graphs from now on: %s\n",
                 std::string(graph.status().message()).c_str());
    use_graphs_ = false;
    return absl::OkStatus();
  }
  graphs_.emplace(key, *std::move(graph));
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::UploadAttnOut() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(attn_out_.data(), host_attn_out_.data(),
                                              padded_ * config().q_size() * sizeof(float), cudaMemcpyHostToDevice,
                                              stream()));
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::StageQkv() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_qkv_.data(), qkv_.data(),
                                              padded_ * config().qkv_size() * sizeof(float), cudaMemcpyDeviceToHost,
                                              stream()));
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::PreAttention(int64_t layer) {
  const ModelConfig& c = config();
  const CudaLayerWeights& w = weights_->layers[layer];
  const int64_t n = padded_;
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
  const int64_t n = padded_;
  // The residual adds ride in the GEMM epilogues: x += o·Woᵀ, then x += down(...).
  LAMINA_RETURN_IF_ERROR(gemm_->RunRoundingX(attn_out_.as<float>(), normed_.as<bf16>(), w.o_proj.as<bf16>(), nullptr,
                                             residual_.as<float>(), n, c.hidden_size, c.q_size(), true, stream()));
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
                                       padded_, c.hidden_size, stream()));
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
                                              padded_ * c.hidden_size * sizeof(float), cudaMemcpyDeviceToDevice,
                                              stream()));
  return FinalNormAndHead(padded_);
}

absl::Status CudaSliceBackend::RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (busy_ != nullptr) {  // a new pass: marks left by an abandoned one go
    clock_.Clear();
    LAMINA_RETURN_IF_ERROR(clock_.Mark(true, stream()));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t bucket = use_graphs_ ? GraphBucket(n) : 0;
  if (bucket == 0) {
    LAMINA_RETURN_IF_ERROR(SetBatch(tokens, positions));
    return EmbedAndProject();
  }
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  // Room for every bucket at once, so that a larger batch does not reallocate the buffers that
  // the smaller buckets' graphs use.
  LAMINA_RETURN_IF_ERROR(Reserve(kLargestBucket));
  // The staging buffers may still feed an abandoned batch's copies.
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  int32_t* host_tokens = host_tokens_.as<int32_t>();
  int32_t* host_positions = host_positions_.as<int32_t>();
  std::copy(tokens.begin(), tokens.end(), host_tokens);
  std::copy(positions.begin(), positions.end(), host_positions);
  std::fill(host_tokens + n, host_tokens + bucket, 0);
  std::fill(host_positions + n, host_positions + bucket, 0);
  tokens_in_batch_ = n;
  padded_ = bucket;
  graphed_ = true;
  attn_out_on_host_ = logits_ready_ = false;
  LAMINA_RETURN_IF_ERROR(RunGraphed(0, [&]() -> absl::Status {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens_.data(), host_tokens_.data(), bucket * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_.data(), host_positions_.data(),
                                                bucket * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
    LAMINA_RETURN_IF_ERROR(EmbedAndProject());
    return attention_on_device_ ? absl::OkStatus() : StageQkv();
  }));
  qkv_staged_ = !attention_on_device_;
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::UploadAttnOutIfOnHost() {
  if (!attn_out_on_host_) return absl::OkStatus();
  attn_out_on_host_ = false;
  return UploadAttnOut();
}

absl::Status CudaSliceBackend::RunMiddle(int64_t slice) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (graphed_ && attention_on_device_) return RunGraphed(slice, [&] { return Middle(slice); });
  if (graphed_ && attn_out_on_host_) {
    attn_out_on_host_ = false;
    LAMINA_RETURN_IF_ERROR(RunGraphed(slice, [&]() -> absl::Status {
      LAMINA_RETURN_IF_ERROR(UploadAttnOut());
      LAMINA_RETURN_IF_ERROR(Middle(slice));
      return StageQkv();
    }));
    qkv_staged_ = true;
    return absl::OkStatus();
  }
  qkv_staged_ = false;
  LAMINA_RETURN_IF_ERROR(UploadAttnOutIfOnHost());
  return Middle(slice);
}

absl::Status CudaSliceBackend::RunLastSlice(absl::Span<const int64_t> rows, std::vector<int32_t>* logits_rows) {
  const ModelConfig& c = config();
  logits_rows->clear();
  if (logits_ready_) {  // RunLocalStep computed every row's; rows[i] is read in place
    logits_ready_ = false;
    logits_rows->assign(rows.begin(), rows.end());
    return absl::OkStatus();
  }
  if (graphed_ && (attn_out_on_host_ || attention_on_device_)) {
    // Logits for every padded row; rows[i] is read in place.
    const bool upload = attn_out_on_host_;
    attn_out_on_host_ = false;
    LAMINA_RETURN_IF_ERROR(RunGraphed(c.num_layers, [&]() -> absl::Status {
      if (upload) LAMINA_RETURN_IF_ERROR(UploadAttnOut());
      return LogitsForAllRows();
    }));
    logits_rows->assign(rows.begin(), rows.end());
    return absl::OkStatus();
  }
  // Logits for the distinct rows asked for, in order of first appearance.
  LAMINA_RETURN_IF_ERROR(UploadAttnOutIfOnHost());
  LAMINA_RETURN_IF_ERROR(PostAttention(c.num_layers - 1));
  std::vector<int32_t> distinct;
  std::map<int64_t, int32_t> index_of;
  for (int64_t row : rows) {
    auto [it, added] = index_of.emplace(row, static_cast<int32_t>(distinct.size()));
    if (added) distinct.push_back(static_cast<int32_t>(row));
    logits_rows->push_back(it->second);
  }
  const int64_t n = static_cast<int64_t>(distinct.size());
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(rows_.data(), distinct.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  LAMINA_RETURN_IF_ERROR(kc::GatherRows(residual_.as<float>(), rows_.as<int32_t>(), selected_.as<float>(), n,
                                        c.hidden_size, stream()));
  return FinalNormAndHead(n);
}

absl::Status CudaSliceBackend::RunLast(absl::Span<const int64_t> rows, Tensor* logits) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const ModelConfig& c = config();
  std::vector<int32_t> logits_rows;
  LAMINA_RETURN_IF_ERROR(RunLastSlice(rows, &logits_rows));
  const int64_t n = static_cast<int64_t>(rows.size());
  if (logits->rank() != 2 || logits->dim(0) != n || logits->dim(1) != c.vocab_size) logits->Reshape({n, c.vocab_size});
  const size_t row_bytes = c.vocab_size * sizeof(float);
  for (int64_t i = 0; i < n;) {  // one copy per run of consecutive rows
    int64_t run = 1;
    while (i + run < n && logits_rows[i + run] == logits_rows[i] + run) ++run;
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->row(i), logits_.as<float>() + logits_rows[i] * c.vocab_size,
                                                run * row_bytes, cudaMemcpyDeviceToHost, stream()));
    i += run;
  }
  return SynchronizePass();
}

absl::Status CudaSliceBackend::RunLastAndSample(absl::Span<const TokenDraw> draws, int32_t* tokens,
                                                TokenLogprobs* logprobs) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (draws.empty()) return busy_ != nullptr ? SynchronizePass() : absl::OkStatus();  // the pass's stretches
  std::vector<int64_t> rows;
  for (const TokenDraw& d : draws) rows.push_back(d.row);
  std::vector<int32_t> logits_rows;
  LAMINA_RETURN_IF_ERROR(RunLastSlice(rows, &logits_rows));

  const int64_t n = static_cast<int64_t>(draws.size());
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_draw_rows_, n * sizeof(int32_t), &retired_host_));
  LAMINA_RETURN_IF_ERROR(
      cuda::EnsureCapacityKeepingOld(&host_draw_params_, n * sizeof(kc::DeviceSamplingParams), &retired_host_));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_draw_tokens_, n * sizeof(int32_t), &retired_host_));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&draw_rows_, n * sizeof(int32_t), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&draw_params_, n * sizeof(kc::DeviceSamplingParams), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&draw_tokens_, n * sizeof(int32_t), stream()));
  auto* params = host_draw_params_.as<kc::DeviceSamplingParams>();
  for (int64_t i = 0; i < n; ++i) {
    const SamplingParams& p = draws[i].params;
    params[i] = {p.temperature, p.top_k, p.top_p, p.seed, draws[i].counter, MinPLogitOffset(p)};
  }
  std::copy(logits_rows.begin(), logits_rows.end(), host_draw_rows_.as<int32_t>());
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(draw_rows_.data(), host_draw_rows_.data(), n * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(draw_params_.data(), host_draw_params_.data(),
                                              n * sizeof(kc::DeviceSamplingParams), cudaMemcpyHostToDevice, stream()));
  LAMINA_ASSIGN_OR_RETURN(const int64_t edits, QueuePenalties(draws, logits_rows));
  LAMINA_RETURN_IF_ERROR(kc::Sample(logits_.as<float>(), draw_rows_.as<int32_t>(),
                                    draw_params_.as<kc::DeviceSamplingParams>(), draw_tokens_.as<int32_t>(), n,
                                    config().vocab_size, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_draw_tokens_.data(), draw_tokens_.data(), n * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, stream()));
  bool with_logprobs = false;
  if (logprobs != nullptr) {
    // Log probabilities are of the raw logits.
    LAMINA_RETURN_IF_ERROR(kc::RestoreLogits(logits_.as<float>(), penalty_edits_.as<kc::DevicePenaltyEdit>(),
                                             penalty_saved_.as<float>(), edits, config().vocab_size, stream()));
    LAMINA_ASSIGN_OR_RETURN(with_logprobs, QueueLogprobs(draws));
  }
  LAMINA_RETURN_IF_ERROR(SynchronizePass());
  std::copy(host_draw_tokens_.as<int32_t>(), host_draw_tokens_.as<int32_t>() + n, tokens);
  if (!with_logprobs) return absl::OkStatus();
  const auto* got = host_draw_logprobs_.as<kc::DeviceTokenLogprobs>();
  for (int64_t i = 0; i < n; ++i) {
    if (!draws[i].params.wants_logprobs()) continue;
    TokenLogprobs& out = logprobs[i];
    out.logprob = got[i].logprob;
    out.top_count = got[i].top_count;
    std::copy(got[i].top_ids, got[i].top_ids + got[i].top_count, out.top_ids);
    std::copy(got[i].top_logprobs, got[i].top_logprobs + got[i].top_count, out.top_logprobs);
  }
  return absl::OkStatus();
}

namespace {

// Whether two draws of one logits row ask for the same edits of it.
bool SamePenalties(const TokenDraw& a, const TokenDraw& b) {
  if (a.params.has_penalties() != b.params.has_penalties()) return false;
  if (!a.params.has_penalties()) return true;
  return a.params.repetition_penalty == b.params.repetition_penalty &&
         a.params.presence_penalty == b.params.presence_penalty &&
         a.params.frequency_penalty == b.params.frequency_penalty && a.params.min_tokens == b.params.min_tokens &&
         a.params.min_tokens_stop_ids == b.params.min_tokens_stop_ids &&
         (a.history == b.history || a.history->entries() == b.history->entries());
}

}  // namespace

absl::StatusOr<int64_t> CudaSliceBackend::QueuePenalties(absl::Span<const TokenDraw> draws,
                                                         absl::Span<const int32_t> logits_rows) {
  int64_t most = 0;
  for (const TokenDraw& d : draws) {
    if (!d.params.has_penalties()) continue;
    if (d.history == nullptr) return absl::InternalError("a draw with penalties has no token history");
    most += MostPenaltyEdits(d.params, static_cast<int64_t>(d.history->entries().size()));
  }
  if (most == 0) return 0;
  LAMINA_RETURN_IF_ERROR(
      cuda::EnsureCapacityKeepingOld(&host_penalty_edits_, most * sizeof(kc::DevicePenaltyEdit), &retired_host_));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&penalty_edits_, most * sizeof(kc::DevicePenaltyEdit), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&penalty_saved_, most * sizeof(float), stream()));
  // A row's edits once: the draws of one row (samples of one prompt) must agree on them.
  absl::flat_hash_map<int32_t, size_t> first_draw;  // logits row -> its first draw
  auto* out = host_penalty_edits_.as<kc::DevicePenaltyEdit>();
  const int64_t vocab = config().vocab_size;
  int64_t n = 0;
  for (size_t i = 0; i < draws.size(); ++i) {
    const int32_t row = logits_rows[i];
    auto [first, added] = first_draw.try_emplace(row, i);
    if (!added) {
      if (!SamePenalties(draws[first->second], draws[i])) {
        return absl::InvalidArgumentError(absl::StrCat("draw ", i, " shares logits row ", draws[i].row, " with draw ",
                                                       first->second, " but not its penalties"));
      }
      continue;
    }
    if (!draws[i].params.has_penalties()) continue;
    ForEachPenaltyEdit(draws[i].params, *draws[i].history, [&](const PenaltyEdit& e) {
      if (e.token >= 0 && e.token < vocab) out[n++] = {row, e.token, e.divisor, e.subtract};
    });
  }
  if (n == 0) return 0;
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(penalty_edits_.data(), out, n * sizeof(kc::DevicePenaltyEdit), cudaMemcpyHostToDevice, stream()));
  LAMINA_RETURN_IF_ERROR(kc::ApplyPenalties(logits_.as<float>(), penalty_edits_.as<kc::DevicePenaltyEdit>(),
                                            penalty_saved_.as<float>(), n, vocab, stream()));
  return n;
}

absl::StatusOr<bool> CudaSliceBackend::QueueLogprobs(absl::Span<const TokenDraw> draws) {
  const int64_t n = static_cast<int64_t>(draws.size());
  if (std::none_of(draws.begin(), draws.end(), [](const TokenDraw& d) { return d.params.wants_logprobs(); })) {
    return false;
  }
  static_assert(kc::kMaxDeviceTopLogprobs == kMaxTopLogprobs);
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_draw_tops_, n * sizeof(int32_t), &retired_host_));
  LAMINA_RETURN_IF_ERROR(
      cuda::EnsureCapacityKeepingOld(&host_draw_logprobs_, n * sizeof(kc::DeviceTokenLogprobs), &retired_host_));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&draw_tops_, n * sizeof(int32_t), stream()));
  LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&draw_logprobs_, n * sizeof(kc::DeviceTokenLogprobs), stream()));
  auto* tops = host_draw_tops_.as<int32_t>();
  for (int64_t i = 0; i < n; ++i) tops[i] = draws[i].params.wants_logprobs() ? draws[i].params.top_logprobs : -1;
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(draw_tops_.data(), tops, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  LAMINA_RETURN_IF_ERROR(kc::Logprobs(logits_.as<float>(), draw_rows_.as<int32_t>(), draw_tokens_.as<int32_t>(),
                                      draw_tops_.as<int32_t>(), draw_logprobs_.as<kc::DeviceTokenLogprobs>(), n,
                                      config().vocab_size, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_draw_logprobs_.data(), draw_logprobs_.data(),
                                              n * sizeof(kc::DeviceTokenLogprobs), cudaMemcpyDeviceToHost, stream()));
  return true;
}

absl::StatusOr<const float*> CudaSliceBackend::HostQkv() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (qkv_staged_) {  // the slice's graph copied it
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
    return host_qkv_.as<float>();
  }
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
  qkv_staged_ = false;
  LAMINA_RETURN_IF_ERROR(kc::PrefillAttention(shape, base, c.qkv_size(), base + c.q_size(),
                                              base + c.q_size() + c.kv_size(), c.qkv_size(),
                                              attn_out_.as<float>() + first_row * c.q_size(), c.q_size(), count,
                                              stream()));
  return pacer_.Paced(stream());  // a prefill of many short prompts launches one of these each
}

absl::Status CudaSliceBackend::ReadResidual(float* out) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, residual_.data(),
                                              tokens_in_batch_ * config().hidden_size * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::ReadAttnOut(float* out) {
  const size_t bytes = tokens_in_batch_ * config().q_size() * sizeof(float);
  if (attn_out_on_host_) {
    std::memcpy(out, host_attn_out_.data(), bytes);
    return absl::OkStatus();
  }
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, attn_out_.data(), bytes, cudaMemcpyDeviceToHost, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::ResumeAt(absl::Span<const int32_t> positions, const float* residual,
                                        const float* attn_out) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(positions.size());
  LAMINA_RETURN_IF_ERROR(Reserve(n));
  LAMINA_RETURN_IF_ERROR(QueuePositions(positions));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(residual_.data(), residual, n * c.hidden_size * sizeof(float),
                                              cudaMemcpyHostToDevice, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(attn_out_.data(), attn_out, n * c.q_size() * sizeof(float), cudaMemcpyHostToDevice, stream()));
  // The sources are pageable and may go away when this returns.
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  BeginPass(n);
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::ResumeOnDevice(absl::Span<const int32_t> positions, bool positions_set) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const int64_t n = static_cast<int64_t>(positions.size());
  if (positions_set) {
    if (n != tokens_in_batch_) {
      return absl::InternalError(absl::StrCat("a batch of ", tokens_in_batch_, " rows resumed with ", n));
    }
  } else {
    LAMINA_RETURN_IF_ERROR(Reserve(n));
    LAMINA_RETURN_IF_ERROR(QueuePositions(positions));
    // The source is pageable; this runs once a pass, before anything of it is queued.
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  }
  BeginPass(n);
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::AttnOutOnDevice() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return UploadAttnOutIfOnHost();
}

absl::Status CudaSliceBackend::Synchronize() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return SynchronizePass();
}

void CudaSliceBackend::set_device_busy(IntervalUnion* busy) {
  busy_ = nullptr;
  if (busy == nullptr) return;
  // A pass marks at most a start and a stop around each layer's slice, the first and the last.
  const size_t marks = 2 * static_cast<size_t>(config().num_layers) + 8;
  absl::Status made = [&]() -> absl::Status {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    LAMINA_ASSIGN_OR_RETURN(clock_, cuda::StreamClock::Create(marks));
    return absl::OkStatus();
  }();
  if (!made.ok()) {
    std::fprintf(stderr, "GPU %d keeps no busy time: %s\n", device_, std::string(made.message()).c_str());
    return;
  }
  busy_ = busy;
}

absl::Status CudaSliceBackend::SynchronizePass() {
  if (busy_ != nullptr) LAMINA_RETURN_IF_ERROR(clock_.Mark(false, stream()));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
  if (busy_ == nullptr) return absl::OkStatus();
  LAMINA_ASSIGN_OR_RETURN(const std::vector<cuda::StreamClock::Interval> computing, clock_.Take(absl::Now()));
  for (const auto& [begin, end] : computing) busy_->Add(begin, end);
  return absl::OkStatus();
}

absl::Status CudaSliceBackend::BeginExchange() {
  if (busy_ == nullptr) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return clock_.Mark(false, stream());
}

absl::Status CudaSliceBackend::EndExchange() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (busy_ != nullptr) LAMINA_RETURN_IF_ERROR(clock_.Mark(true, stream()));
  return pacer_.Paced(stream());
}

}  // namespace lamina
