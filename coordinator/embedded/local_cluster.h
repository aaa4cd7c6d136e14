// Single-process mode: one compute engine and one memory node (an AttentionExecutor) in this
// process, wired through the in-process transport, both on one device (the CPU or one GPU), driven
// by the same batching loop a coordinator runs: all requests are prefilled as one batch, then
// decoded together, each leaving the batch when it finishes (end of sequence, a stop id, a stop
// string, its token budget or the model's context).
// Thread-compatible: one Generate() at a time.
#ifndef LAMINA_COORDINATOR_EMBEDDED_LOCAL_CLUSTER_H_
#define LAMINA_COORDINATOR_EMBEDDED_LOCAL_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda/device.h"
#include "common/threading/thread_pool.h"
#include "common/tokenizer/tokenizer.h"
#include "common/topology/kv_dtype.h"
#include "compute_node/engine/device_engine.h"
#include "compute_node/model/model_weights.h"
#include "compute_node/sampling/sampler.h"
#include "coordinator/sequence/stop_conditions.h"

namespace lamina {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included where the model wants one
  int32_t n = 1;                // samples; the prompt is prefilled once and shared; sample k uses seed + k
  SamplingParams sampling;
  int32_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  // Generation ends once a sample's text contains one of these (empty ones are ignored); the text
  // before it is the last shown (TokenEvent::text), as the cluster's API does.
  std::vector<std::string> stop_strings;
};

// One generated token. `finish` is kNone except on a request's last token.
struct TokenEvent {
  size_t request;  // index into the requests passed to Generate
  int32_t sample;  // which of the request's n samples
  int32_t token;
  FinishReason finish;
  const TokenLogprobs* logprobs;  // when the request's sampling asks for them, for the callback's span; else null
  // The sample's text this token lets be shown, for the callback's span: decoded as it comes
  // (never splitting a UTF-8 character), held back while it may begin a stop string; on the last
  // token, all that is left, or what precedes the stop string (coordinator/sequence/text_stream.h).
  std::string_view text;
};
using TokenCallback = std::function<void(const TokenEvent&)>;

class LocalCluster {
 public:
  // Loads weights and tokenizer from a Hugging Face folder, the weights onto `device` (the CPU by
  // default). FailedPrecondition when the device cannot be used here.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Load(const std::string& model_dir,
                                                           ThreadPool* pool = &ThreadPool::Default(),
                                                           const DeviceSpec& device = DeviceSpec{});
  // Runs `weights` with the tokenizer of the Hugging Face folder `tokenizer_dir` (for example
  // ModelWeights::Random of that folder's shape).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Create(std::unique_ptr<ModelWeights> weights,
                                                             const std::string& tokenizer_dir,
                                                             ThreadPool* pool = &ThreadPool::Default(),
                                                             const DeviceSpec& device = DeviceSpec{});

  // Generates for every request, calling `on_token` as each token is produced (in step order).
  // Requests are validated before any work starts: InvalidArgument names the request and what is
  // wrong (empty prompt, an id outside the vocabulary, a prompt that fills the context, bad
  // sampling values).
  absl::Status Generate(absl::Span<const GenerationRequest> requests, const TokenCallback& on_token);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelConfig& config() const { return weights_->config(); }

  // The KV pool's element type from now on, as a topology's memory node's `kv_dtype`
  // (common/topology/kv_dtype.h; "auto" at first). InvalidArgument for a setting that
  // ChooseKvDtype refuses here.
  absl::Status SetKvDtype(std::string_view setting);

 private:
  LocalCluster(std::unique_ptr<DeviceWeights> weights, std::unique_ptr<Tokenizer> tokenizer, ThreadPool* pool)
      : weights_(std::move(weights)), tokenizer_(std::move(tokenizer)), pool_(pool) {
    kv_dtype_ = *ChooseKvDtype("auto", config(), weights_->device().is_cuda);  // "auto" is never refused
  }
  absl::Status Validate(absl::Span<const GenerationRequest> requests) const;

  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ThreadPool* pool_;
  DType kv_dtype_;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_EMBEDDED_LOCAL_CLUSTER_H_
