// The model slices on one GPU: bf16 weights and GEMM inputs (cuBLASLt), float32 residual stream,
// q/k/v and logits. The SliceBackend calls stage q/k/v and attention outputs through pinned host
// memory for memory nodes reached over a host transport. The device-side calls below run a batch
// with no host synchronisation at all, for attention on the same GPU, and can be captured into a
// CUDA graph (the e2e benchmark captures a whole decode step per batch size).
// Thread-compatible: one batch at a time; any thread (each call makes its device current).
#ifndef LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_SLICE_BACKEND_H_
#define LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_SLICE_BACKEND_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <memory>

#include "common/cuda/device_buffer.h"
#include "compute_node/engine/cuda/cuda_model_weights.h"
#include "compute_node/engine/slice_backend.h"
#include "kernels/cuda/gemm.h"

namespace lamina {

class CudaSliceBackend : public SliceBackend {
 public:
  // `weights` must outlive the backend and live on device `device`.
  static absl::StatusOr<std::unique_ptr<CudaSliceBackend>> Create(const CudaModelWeights* weights, int device);

  const ModelConfig& config() const override { return weights_->config; }
  QkvLayout qkv_layout() const override;
  absl::Status RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) override;
  absl::Status RunMiddle(int64_t slice) override;
  absl::Status RunLast(absl::Span<const int64_t> rows, Tensor* logits) override;
  absl::StatusOr<const float*> HostQkv() override;
  float* HostAttnOut() override;
  absl::Status PrefillAttention(int64_t first_row, int64_t count) override;

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

 private:
  CudaSliceBackend(const CudaModelWeights* weights, int device) : weights_(weights), device_(device) {}
  absl::Status Reserve(int64_t tokens);
  absl::Status PreAttention(int64_t layer);
  absl::Status PostAttention(int64_t layer);
  absl::Status UploadAttnOutIfOnHost();
  absl::Status FinalNormAndHead(int64_t rows);

  const CudaModelWeights* weights_;
  int device_;
  cuda::Stream stream_;
  std::unique_ptr<kernels::cuda::Gemm> gemm_;
  int64_t capacity_ = 0;  // tokens the buffers hold
  int64_t tokens_in_batch_ = 0;
  bool attn_out_on_host_ = false;
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
  cuda::PinnedBuffer host_qkv_;       // float [capacity, qkv_size]
  cuda::PinnedBuffer host_attn_out_;  // float [capacity, q_size]
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_CUDA_CUDA_SLICE_BACKEND_H_
