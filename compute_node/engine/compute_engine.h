// The compute node's layer loop: runs the model slices on a batch and, between slices, hands q/k/v
// to the memory side through an AttentionService and reads the attention output back. The same
// loop serves single-process mode (AttentionService = an in-process AttentionExecutor) and the
// cluster (AttentionService = a transport client), so there is one forward pass to keep right.
//
// Prefill runs the prompt's causal attention here (compute-bound work stays on the compute node)
// and ships each layer's k/v to the memory side in bulk. Decode sends each new token's q/k/v.
// The slices run on a SliceBackend (CPU or GPU); this loop is the same for both.
// Under rotational pipelining over several compute nodes (set_handoff), each engine runs only the
// slices its node owns: it starts a later slice from the residual stream and attention output the
// previous node handed over, and hands them on after its own. The node owning slice 0 reserves the
// KV slots; the one owning the last slice draws the tokens (the others leave `tokens` alone).
// Between GPUs the hand-overs, and decode's attention where the memory nodes are on device links,
// are queued on the GPU's stream, so that each node queues its slices of a step ahead and no host
// thread sits between a hand-over's arrival and the slice it feeds; every node then reserves the
// KV slots, since its memory nodes begin its layers before slice 0 has run.
// Thread-compatible: one batch at a time per engine.
#ifndef LAMINA_COMPUTE_NODE_ENGINE_COMPUTE_ENGINE_H_
#define LAMINA_COMPUTE_NODE_ENGINE_COMPUTE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/attention/attention_service.h"
#include "common/tensor/tensor.h"
#include "common/threading/thread_pool.h"
#include "compute_node/engine/slice_backend.h"
#include "compute_node/model/model_weights.h"
#include "compute_node/rotation/slice_handoff.h"
#include "compute_node/sampling/sampler.h"

namespace lamina {

struct PrefillSequence {
  SequenceId seq;
  absl::Span<const int32_t> tokens;  // the whole prompt, positions 0..size-1
};

struct DecodeToken {
  SequenceId seq;
  int32_t token;     // the last sampled token, fed back
  int32_t position;  // its position
};

class ComputeEngine {
 public:
  // On the CPU kernels.
  ComputeEngine(const ModelWeights* weights, AttentionService* attention,
                ThreadPool* pool = &ThreadPool::Default());
  // On the given backends, one for prefill batches and one for decode batches (of one model).
  ComputeEngine(std::unique_ptr<SliceBackend> prefill, std::unique_ptr<SliceBackend> decode,
                AttentionService* attention);

  // Runs all prompts as one batch. Writes logits [num prompts, vocab] for each prompt's last
  // token, or with `all_positions` [total prompt tokens, vocab] for every position.
  // InvalidArgument for empty prompts, out-of-vocabulary ids or prompts longer than the context;
  // on any error the sequences' slots are freed.
  absl::Status Prefill(absl::Span<const PrefillSequence> prompts, bool all_positions, Tensor* logits);

  // One decode step for a batch of sequences: logits [batch, vocab].
  absl::Status Decode(absl::Span<const DecodeToken> batch, Tensor* logits);

  // The same passes, ending in one token per draw instead of logits: tokens[draws.size()], and
  // logprobs[i] for each draw whose params want log probabilities (`logprobs` [draws.size()] may
  // be null when none does). A prefill draw's row is the index of its prompt; a decode draw's row
  // is its index in the batch. On a GPU the tokens are drawn on the device and only they (and
  // the log probabilities asked for) come back to the host.
  absl::Status Prefill(absl::Span<const PrefillSequence> prompts, absl::Span<const TokenDraw> draws, int32_t* tokens,
                       TokenLogprobs* logprobs = nullptr);
  absl::Status Decode(absl::Span<const DecodeToken> batch, absl::Span<const TokenDraw> draws, int32_t* tokens,
                      TokenLogprobs* logprobs = nullptr);

  const ModelConfig& config() const { return decode_->config(); }
  // The route of the next batches through the compute nodes (null: every slice runs here). Must
  // outlive its use.
  void set_handoff(SliceHandoff* handoff) { handoff_ = handoff; }
  // Whether this node runs the last slice (and so draws the tokens).
  bool RunsLastSlice() const { return Owns(config().num_layers); }
  // Where the backends time their work on a device, each pass's computing stretches (the
  // exchanges with other nodes left out) go to `busy`, which must outlive the engine.
  void set_device_busy(IntervalUnion* busy) {
    prefill_->set_device_busy(busy);
    decode_->set_device_busy(busy);
  }

 private:
  // The last slice of a batch, given the backend that ran the others.
  using LastSlice = absl::FunctionRef<absl::Status(SliceBackend&)>;
  // A layer's attention between its slices (local for prefill, remote for decode).
  using LayerAttention = absl::FunctionRef<absl::Status(int64_t layer)>;

  absl::Status CheckToken(int32_t token, int32_t position) const;
  absl::Status PrefillThen(absl::Span<const PrefillSequence> prompts, LastSlice last);
  absl::Status RunPrefill(absl::Span<const PrefillSequence> prompts, absl::Span<const int32_t> tokens,
                          absl::Span<const int32_t> positions, LastSlice last);
  absl::Status DecodeThen(absl::Span<const DecodeToken> batch, LastSlice last);
  // The rest of a decode step (after RunFirst) with the exchanges queued on the GPU.
  absl::Status DecodeOnDevice(SliceBackend& b, DeviceDecode* device, LastSlice last);
  // The rest of a decode step (after Reserve) whose sequences are all in this node's own pool on
  // its GPU: the whole step queued on the device, one graph per batch bucket.
  absl::Status DecodeLocally(SliceBackend& b, LocalDeviceDecode* local, absl::Span<const int32_t> tokens,
                             absl::Span<const int32_t> positions, LastSlice last);
  // A rotating batch's decode step with the exchanges queued on the GPU: the memory nodes begin
  // the layers this node owns, and RunSlices queues them.
  absl::Status DecodeRotatingOnDevice(SliceBackend& b, DeviceDecode* device, absl::Span<const int32_t> tokens,
                                      absl::Span<const int32_t> positions, LastSlice last);
  // The layer loop of prefill, of host-path decode and of rotating batches: every slice this node
  // owns, each followed by its layer's attention, handing the batch over where the next slice
  // runs elsewhere. A rotating batch's pass ends with the backend's queued work done.
  absl::Status RunSlices(SliceBackend& b, absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions,
                         LayerAttention attention, LastSlice last);
  absl::Status RunOwnedSlices(SliceBackend& b, absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions,
                              LayerAttention attention, LastSlice last);
  bool Owns(int64_t slice) const { return handoff_ == nullptr || handoff_->Owns(slice); }
  // The layers whose attention follows a slice this node runs (every layer without hand-overs).
  std::vector<int64_t> OwnedLayers() const;
  // Makes slice `slice` (0 < slice <= num_layers) ready to run here: receives its inputs when
  // another node ran the slice before.
  absl::Status ResumeIfHandedOver(SliceBackend& b, int64_t slice, absl::Span<const int32_t> positions);
  absl::Status ReceiveHandOver(SliceBackend& b, int64_t slice, absl::Span<const int32_t> positions);
  // Sends slice `slice`'s residual stream (before attention) or attention output (after) on to
  // the node that runs it, when that is not this one.
  absl::Status HandOverResidual(SliceBackend& b, int64_t slice, int64_t rows);
  absl::Status HandOverAttnOut(SliceBackend& b, int64_t slice, int64_t rows);
  absl::Status SendResidual(SliceBackend& b, int64_t slice, int64_t rows);
  absl::Status SendAttnOut(SliceBackend& b, int64_t slice, int64_t rows);

  AttentionService* attention_;
  std::unique_ptr<SliceBackend> prefill_;
  std::unique_ptr<SliceBackend> decode_;
  std::vector<DecodeEntry> entries_;
  SliceHandoff* handoff_ = nullptr;
  std::vector<float> handed_residual_, handed_attn_out_;  // host staging of hand-overs
  // This pass's hand-overs to the next node and from the previous one go GPU to GPU; whether the
  // backend holds this pass's positions already.
  bool sends_on_device_ = false;
  bool receives_on_device_ = false;
  bool positions_set_ = false;
  // Whether the last pass's wait for a hand-over from another compute node gave up.
  bool handover_gave_up_ = false;
  bool host_stores_noted_ = false;  // said once that prefills store k/v through host memory
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_COMPUTE_ENGINE_H_
