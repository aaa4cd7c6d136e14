// The model slices of one batch on one device. ComputeEngine's layer loop drives a SliceBackend and
// never touches a device itself, so the CPU and the GPU run the very same loop (and the CPU slices
// are the oracle for the GPU ones). A backend owns one batch's activations: the engine keeps one
// for prefill and one for decode.
//
// The calls of one batch: RunFirst, then per layer either PrefillAttention (local causal attention
// over a prompt's rows) or HostAttnOut (whose buffer the caller fills with attention outputs),
// then RunMiddle for the next layer, and finally RunLast (logits) or RunLastAndSample (tokens).
// HostQkv hands q/k/v to the memory side.
// Thread-compatible: one batch at a time.
#ifndef LAMINA_COMPUTE_NODE_ENGINE_SLICE_BACKEND_H_
#define LAMINA_COMPUTE_NODE_ENGINE_SLICE_BACKEND_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/attention/attention_service.h"
#include "common/metrics/interval_union.h"
#include "common/model_config/model_config.h"
#include "common/tensor/tensor.h"
#include "compute_node/sampling/logprobs.h"
#include "compute_node/sampling/sampler.h"

namespace lamina {

class SliceBackend {
 public:
  virtual ~SliceBackend() = default;

  virtual const ModelConfig& config() const = 0;
  // Where q, k and v sit in the rows HostQkv() returns.
  virtual QkvLayout qkv_layout() const = 0;

  // Slice 0 for a new batch: embedding, then layer 0 up to q/k/v. Token ids and positions must be
  // valid (ComputeEngine checks them).
  virtual absl::Status RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) = 0;
  // Slice `slice` (0 < slice < num_layers): the rest of layer slice-1, then layer `slice` up to q/k/v.
  virtual absl::Status RunMiddle(int64_t slice) = 0;
  // The last slice; logits [rows.size(), vocab] for the given batch rows.
  virtual absl::Status RunLast(absl::Span<const int64_t> rows, Tensor* logits) = 0;
  // The last slice, then one token per draw into tokens[draws.size()] (draws[i].row is a batch
  // row; rows may repeat), and into logprobs[i] the log probabilities of each draw whose params
  // want them (`logprobs` [draws.size()] may be null when no draw does). A draw's penalties edit
  // the logits it draws from, not those of its log probabilities. By default RunLast, then
  // ApplyPenalties, SampleToken and ComputeLogprobs on the host; a GPU backend does them on the
  // device and moves only what they give.
  virtual absl::Status RunLastAndSample(absl::Span<const TokenDraw> draws, int32_t* tokens, TokenLogprobs* logprobs);

  // The batch's q/k/v after the latest slice, in host memory: [tokens, qkv_layout().row_stride].
  // Valid until the next call.
  virtual absl::StatusOr<const float*> HostQkv() = 0;
  // A host buffer [tokens, q_size] for the attention output that the next slice reads. Calling it
  // means the caller writes every row before RunMiddle/RunLast.
  virtual float* HostAttnOut() = 0;
  // Device-side attention (GPU backends, for a DeviceDecode service): from the next RunFirst on,
  // q/k/v stay on the device, and the caller queues each layer's exchange on device_batch().stream
  // between the slices, writing every row of device_batch().attn_out, instead of calling HostQkv
  // and HostAttnOut. Returns whether the backend does it; false leaves it off.
  virtual bool SetAttentionOnDevice(bool on) { return !on; }
  struct DeviceBatch {
    const float* qkv = nullptr;  // [rows, qkv_layout().row_stride]
    float* attn_out = nullptr;   // [rows, q_size]
    CUstream_st* stream = nullptr;
    float* residual = nullptr;   // [rows, hidden]: the residual stream after the latest slice
  };
  // Valid from RunFirst to the end of the batch.
  virtual DeviceBatch device_batch() const { return {}; }

  // Rotational pipelining (a batch's slices on several compute nodes). ReadResidual copies the
  // batch's residual stream after the latest slice to `out` [tokens, hidden]; ReadAttnOut copies
  // the attention output the next slice reads (HostAttnOut as the caller filled it, or
  // PrefillAttention's) to `out` [tokens, q_size]. ResumeAt starts a batch at a later slice that
  // another node ran up to: `positions` as for RunFirst, the residual stream and attention output
  // as that node's ReadResidual and ReadAttnOut gave them; RunMiddle or RunLast follow.
  virtual absl::Status ReadResidual(float* out) = 0;
  virtual absl::Status ReadAttnOut(float* out) = 0;
  virtual absl::Status ResumeAt(absl::Span<const int32_t> positions, const float* residual,
                                const float* attn_out) = 0;
  // The same GPU to GPU (a GPU backend; the others return Unimplemented), with no host wait:
  // ResumeOnDevice starts the batch at a later slice, its residual stream and attention output
  // then written into device_batch().residual and .attn_out by work the caller queues on the
  // stream. `positions_set`: this pass set them already (RunFirst or an earlier ResumeOnDevice of
  // as many rows), so they are not uploaded again. AttnOutOnDevice makes device_batch().attn_out
  // hold the attention output the next slice reads (uploading HostAttnOut's, queued).
  // Synchronize waits for the work queued so far.
  virtual absl::Status ResumeOnDevice(absl::Span<const int32_t> positions, bool positions_set) {
    return absl::UnimplementedError("this backend hands batches over through host memory only");
  }
  virtual absl::Status AttnOutOnDevice() {
    return absl::UnimplementedError("this backend hands batches over through host memory only");
  }
  virtual absl::Status Synchronize() { return absl::OkStatus(); }

  // Busy time on a device (a GPU backend; the others keep none, their node's busy time being its
  // threads'): the backend times its queued work on the device from RunFirst on, leaving out the
  // exchanges with other nodes that the caller brackets with BeginExchange and EndExchange
  // (sends, waits for flags, host round trips), and adds a pass's computing stretches to `busy`
  // once its work is done (RunLast, RunLastAndSample, Synchronize). `busy` must outlive the
  // backend; null turns the timing off.
  virtual void set_device_busy(IntervalUnion* busy) {}
  virtual absl::Status BeginExchange() { return absl::OkStatus(); }
  virtual absl::Status EndExchange() { return absl::OkStatus(); }

  // A decode step whose attention runs on this backend's device, queued on device_batch().stream
  // by `attention(layer)` between the slices (a local KV pool on the same GPU). BeginLocalStep
  // stages the batch and returns the rows the step runs over: the batch, or the graph bucket it is
  // padded to (padding rows compute on token 0 at position 0 and are never read). RunLocalStep then
  // runs every slice with the layers' attention, up to the logits of every row, as one CUDA graph
  // per (rows, attention_key) where the backend captures graphs, else eagerly; RunLast or
  // RunLastAndSample follow. `attention_key` must change whenever what `attention` queues would.
  // Unimplemented by backends without a device stream.
  using LayerAttention = absl::FunctionRef<absl::Status(int64_t layer)>;
  virtual absl::StatusOr<int64_t> BeginLocalStep(absl::Span<const int32_t> tokens,
                                                 absl::Span<const int32_t> positions) {
    return absl::UnimplementedError("this backend runs no device-side steps");
  }
  virtual absl::Status RunLocalStep(uint64_t attention_key, LayerAttention attention) {
    return absl::UnimplementedError("this backend runs no device-side steps");
  }

  // Causal attention over the batch rows [first_row, first_row + count), which hold one prompt
  // from position 0, into the attention output the next slice reads.
  virtual absl::Status PrefillAttention(int64_t first_row, int64_t count) = 0;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_SLICE_BACKEND_H_
