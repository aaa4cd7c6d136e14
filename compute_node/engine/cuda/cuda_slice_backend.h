// The model slices on one GPU: bf16 weights and GEMM inputs (cuBLASLt), float32 residual stream,
// q/k/v and logits. The SliceBackend calls stage q/k/v and attention outputs through pinned host
// memory for memory nodes reached over a host transport; RunLastAndSample draws tokens on the GPU
// and brings back only them. The device-side calls below run a batch with no host synchronisation
// at all, for attention on the same GPU, and can be captured into a CUDA graph (the e2e benchmark
// captures a whole decode step per batch size).
//
// With `graphs`, a batch of up to 256 tokens that goes through the host calls (RunFirst, HostQkv,
// HostAttnOut, RunMiddle, RunLast or RunLastAndSample: the decode path) runs padded to a bucket
// size (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256). Each of its slices, with the copies of
// q/k/v out and of attention outputs in, is one CUDA graph launch, captured at the slice's first use
// in that bucket. The host waits on the GPU only where the data plane needs q/k/v, and at the end.
// Should a capture fail, the backend says so on stderr and goes on without graphs.
// Padding rows compute on token 0 at position 0; rows never mix, so they change no real row. The
// buffers then hold 256 rows from the first batch on; a batch beyond that (run eagerly) grows
// them, and the graphs are captured again.
// Thread-compatible: one batch at a time; any thread (each call makes its device current).
#ifndef LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_SLICE_BACKEND_H_
#define LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_SLICE_BACKEND_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/graph.h"
#include "common/cuda/queue_pacer.h"
#include "common/cuda/stream_clock.h"
#include "compute_node/engine/cuda/cuda_model_weights.h"
#include "compute_node/engine/slice_backend.h"
#include "kernels/cuda/gemm.h"

namespace lamina {

class CudaSliceBackend : public SliceBackend {
 public:
  // `weights` must outlive the backend and live on device `device`.
  static absl::StatusOr<std::unique_ptr<CudaSliceBackend>> Create(const CudaModelWeights* weights, int device,
                                                                  bool graphs = false);

  const ModelConfig& config() const override { return weights_->config; }
  QkvLayout qkv_layout() const override;
  absl::Status RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) override;
  absl::Status RunMiddle(int64_t slice) override;
  absl::Status RunLast(absl::Span<const int64_t> rows, Tensor* logits) override;
  absl::Status RunLastAndSample(absl::Span<const TokenDraw> draws, int32_t* tokens, TokenLogprobs* logprobs) override;
  absl::StatusOr<const float*> HostQkv() override;
  float* HostAttnOut() override;
  absl::Status PrefillAttention(int64_t first_row, int64_t count) override;
  // Hand-overs go through host memory; a resumed batch runs eagerly (no graphs).
  absl::Status ReadResidual(float* out) override;
  absl::Status ReadAttnOut(float* out) override;
  absl::Status ResumeAt(absl::Span<const int32_t> positions, const float* residual, const float* attn_out) override;
  absl::Status ResumeOnDevice(absl::Span<const int32_t> positions, bool positions_set) override;
  absl::Status AttnOutOnDevice() override;
  absl::Status Synchronize() override;
  // Makes the clock's events now (a GPU that cannot says so on stderr and keeps no busy time).
  void set_device_busy(IntervalUnion* busy) override;
  absl::Status BeginExchange() override;
  absl::Status EndExchange() override;
  // Device-side attention: the slices' graphs then leave out the host copies.
  bool SetAttentionOnDevice(bool on) override {
    attention_on_device_ = on;
    return true;
  }
  DeviceBatch device_batch() const override {
    return {qkv_.as<float>(), attn_out_.as<float>(), stream(), residual_.as<float>()};
  }

  // A whole decode step with attention on this GPU (SliceBackend::BeginLocalStep): with `graphs`,
  // one graph per (bucket, attention key), at most kMostStepGraphs kept.
  absl::StatusOr<int64_t> BeginLocalStep(absl::Span<const int32_t> tokens,
                                         absl::Span<const int32_t> positions) override;
  absl::Status RunLocalStep(uint64_t attention_key, LayerAttention attention) override;

  // Device-side steps, queued on stream() without synchronising.
  // Copies the batch's tokens and positions in (from pageable memory: synchronous for the host).
  absl::Status SetBatch(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions);
  absl::Status EmbedAndProject();              // slice 0 on the batch set
  absl::Status Middle(int64_t slice);          // reads device_attn_out()
  absl::Status LogitsForAllRows();             // the last slice; device_logits() [tokens, vocab]
  float* device_qkv() const { return qkv_.as<float>(); }            // [tokens, qkv_size]
  float* device_attn_out() const { return attn_out_.as<float>(); }  // [tokens, q_size]
  float* device_logits() const { return logits_.as<float>(); }      // [tokens, vocab]
  const int32_t* device_positions() const { return positions_.as<int32_t>(); }
  cudaStream_t stream() const { return stream_.get(); }
  int64_t num_tokens() const { return tokens_in_batch_; }
  // Graphs captured so far (one per slice and bucket used).
  int64_t num_graphs() const { return static_cast<int64_t>(graphs_.size()); }

 private:
  CudaSliceBackend(const CudaModelWeights* weights, int device, bool graphs)
      : weights_(weights), device_(device), use_graphs_(graphs) {}
  absl::Status Reserve(int64_t tokens);
  // Queues the copy of `positions` (pageable: the caller synchronizes before they go away) into
  // positions_, which Reserve sized.
  absl::Status QueuePositions(absl::Span<const int32_t> positions);
  // A new pass over `rows` rows: nothing of it graphed, staged or on the host yet.
  void BeginPass(int64_t rows);
  // Runs `work` as the graph of (current bucket, slice): launched if captured, else run eagerly
  // and captured for next time.
  absl::Status RunGraphed(int64_t slice, absl::FunctionRef<absl::Status()> work);
  absl::Status UploadAttnOut();  // host_attn_out_ -> attn_out_, padded rows
  absl::Status StageQkv();       // qkv_ -> host_qkv_, padded rows
  // The last slice. Afterwards the logits of rows[i] are in logits_ row (*logits_rows)[i].
  absl::Status RunLastSlice(absl::Span<const int64_t> rows, std::vector<int32_t>* logits_rows);
  // Before the draws' Sample: queues their penalties' edits of the logits (the rows of
  // `logits_rows`); returns how many, for RestoreLogits. InvalidArgument when draws of one row ask
  // for different edits.
  absl::StatusOr<int64_t> QueuePenalties(absl::Span<const TokenDraw> draws, absl::Span<const int32_t> logits_rows);
  // After the draws' Sample: queues the log probabilities of those that want them, and their copy
  // to host_draw_logprobs_. False (nothing queued) when none does.
  absl::StatusOr<bool> QueueLogprobs(absl::Span<const TokenDraw> draws);
  absl::Status PreAttention(int64_t layer);
  absl::Status PostAttention(int64_t layer);
  absl::Status UploadAttnOutIfOnHost();
  absl::Status FinalNormAndHead(int64_t rows);
  // Waits for the stream. With busy timing, the pass's computing ends first, and its stretches
  // go to busy_ once the stream is done.
  absl::Status SynchronizePass();

  const CudaModelWeights* weights_;
  int device_;
  bool use_graphs_;
  cuda::Stream stream_;
  std::unique_ptr<kernels::cuda::Gemm> gemm_;
  int64_t capacity_ = 0;  // tokens the buffers hold
  int64_t tokens_in_batch_ = 0;
  int64_t padded_ = 0;      // rows the kernels run over: tokens_in_batch_, or its bucket
  bool graphed_ = false;    // the batch runs as graphs (padded_ is its bucket)
  bool attn_out_on_host_ = false;
  bool qkv_staged_ = false;  // host_qkv_ already holds the latest q/k/v (a graph copied it)
  bool attention_on_device_ = false;  // SetAttentionOnDevice
  // (bucket, slice, attention on device): with the host copies or without.
  std::map<std::tuple<int64_t, int64_t, bool>, cuda::Graph> graphs_;
  // Whole local steps: (bucket, attention key). Keys of tables that moved are never used again, so
  // past kMostStepGraphs the map starts afresh.
  static constexpr size_t kMostStepGraphs = 64;
  std::map<std::pair<int64_t, uint64_t>, cuda::Graph> step_graphs_;
  bool logits_ready_ = false;  // RunLocalStep left every row's logits in logits_
  // Device activations.
  cuda::DeviceBuffer tokens_;      // int32 [capacity]
  cuda::DeviceBuffer positions_;   // int32 [capacity]
  cuda::DeviceBuffer rows_;        // int32 [capacity]: rows that get logits
  cuda::DeviceBuffer residual_;    // float [capacity, hidden]
  cuda::DeviceBuffer normed_;      // bf16 [capacity, max(hidden, q_size)]: GEMM input
  cuda::DeviceBuffer qkv_;         // float [capacity, qkv_size]
  cuda::DeviceBuffer attn_out_;    // float [capacity, q_size]
  cuda::DeviceBuffer gate_up_;     // float [capacity, 2 intermediate]
  cuda::DeviceBuffer activated_;   // bf16 [capacity, intermediate]
  cuda::DeviceBuffer selected_;    // float [capacity, hidden]: rows gathered for the LM head
  cuda::DeviceBuffer logits_;      // float [capacity, vocab]
  // Host staging.
  cuda::PinnedBuffer host_tokens_;     // int32 [capacity]
  cuda::PinnedBuffer host_positions_;  // int32 [capacity]
  cuda::PinnedBuffer host_qkv_;        // float [capacity, qkv_size]
  cuda::PinnedBuffer host_attn_out_;   // float [capacity, q_size]
  // Token draws: the logits row, parameters and token of each; for log probabilities, how many
  // alternatives each wants (-1: none) and what it got.
  cuda::PinnedBuffer host_draw_rows_, host_draw_params_, host_draw_tokens_, host_draw_tops_, host_draw_logprobs_;
  // Outgrown pinned buffers, kept: cudaFreeHost may wait for the whole device, where a data plane's
  // waits may spin on another node's progress. Device buffers are stream-ordered for the same reason.
  std::vector<cuda::PinnedBuffer> retired_host_;
  cuda::DeviceBuffer draw_rows_, draw_params_, draw_tokens_, draw_tops_, draw_logprobs_;
  cuda::PinnedBuffer host_penalty_edits_;
  cuda::DeviceBuffer penalty_edits_, penalty_saved_;  // penalized logits' edits and old values
  // Busy timing (set_device_busy): clock_ marks the stream's computing between exchanges.
  IntervalUnion* busy_ = nullptr;
  cuda::StreamClock clock_;
  // Ends a unit of queued work at each exchange's end and each prompt's attention (a layer's
  // slice, its exchanges, or a prompt: tens of launches at most), so that the thread never queues
  // so far ahead of the GPU that a launch blocks (common/cuda/queue_pacer.h).
  cuda::QueuePacer pacer_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_SLICE_BACKEND_H_
