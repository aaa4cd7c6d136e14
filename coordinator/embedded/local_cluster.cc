#include "coordinator/embedded/local_cluster.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/model_tokenizer.h"
#include "compute_node/engine/compute_engine.h"
#include "memory_node/attention/attention_executor.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Load(const std::string& model_dir, ThreadPool* pool) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, ModelWeights::Load(model_dir));
  LAMINA_ASSIGN_OR_RETURN(Tokenizer tokenizer, LoadModelTokenizer(model_dir, weights->config));
  return std::unique_ptr<LocalCluster>(
      new LocalCluster(std::move(weights), std::make_unique<Tokenizer>(std::move(tokenizer)), pool));
}

absl::Status LocalCluster::Validate(absl::Span<const GenerationRequest> requests) const {
  const ModelConfig& c = config();
  for (size_t r = 0; r < requests.size(); ++r) {
    const GenerationRequest& req = requests[r];
    const std::string which = absl::StrCat("request ", r + 1, ": ");
    if (req.prompt.empty()) return absl::InvalidArgumentError(which + "the prompt is empty");
    if (static_cast<int64_t>(req.prompt.size()) >= c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(which, "the prompt has ", req.prompt.size(),
                                                     " tokens; the model's context is ", c.max_position_embeddings,
                                                     " tokens, which leaves no room to generate"));
    }
    for (int32_t id : req.prompt) {
      if (id < 0 || id >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(which, "token id ", id, " is outside the vocabulary (0..",
                                                       c.vocab_size - 1, ")"));
      }
    }
    if (req.max_tokens < 1) return absl::InvalidArgumentError(which + "max_tokens must be at least 1");
    absl::Status sampling = req.sampling.Validate();
    if (!sampling.ok()) return absl::InvalidArgumentError(which + std::string(sampling.message()));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Generate(absl::Span<const GenerationRequest> requests, const TokenCallback& on_token) {
  LAMINA_RETURN_IF_ERROR(Validate(requests));
  if (requests.empty()) return absl::OkStatus();
  const ModelConfig& c = config();

  // A pool with exactly the slots these requests can use: nothing is overcommitted.
  int64_t slots = 0;
  for (const GenerationRequest& req : requests) {
    slots += std::min<int64_t>(c.max_position_embeddings, static_cast<int64_t>(req.prompt.size()) + req.max_tokens);
  }
  LAMINA_ASSIGN_OR_RETURN(
      std::unique_ptr<AttentionExecutor> memory_node,
      AttentionExecutor::Create({c.num_layers, slots, {c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window}},
                                pool_));
  ComputeEngine engine(weights_.get(), memory_node.get(), pool_);

  struct Active {
    size_t request;
    Sampler sampler;
    int32_t last_token = 0;
    int32_t next_position = 0;
    int32_t generated = 0;
  };
  std::vector<Active> active;
  std::vector<PrefillSequence> prompts;
  for (size_t r = 0; r < requests.size(); ++r) {
    active.push_back({r, Sampler(requests[r].sampling)});
    prompts.push_back({static_cast<SequenceId>(r), requests[r].prompt});
  }

  // Samples one token per active sequence from `logits`, reports it, and drops finished ones.
  auto advance = [&](const Tensor& logits) {
    std::vector<Active> still_active;
    for (size_t i = 0; i < active.size(); ++i) {
      Active& a = active[i];
      const GenerationRequest& req = requests[a.request];
      const int32_t token = a.sampler.Sample(logits.row(static_cast<int64_t>(i)), c.vocab_size);
      ++a.generated;
      const FinishReason finish =
          CheckFinish(token, a.generated, a.next_position, {req.max_tokens, req.ignore_eos, req.stop_ids}, c);
      on_token({a.request, token, finish});
      if (finish != FinishReason::kNone) {
        memory_node->Free(static_cast<SequenceId>(a.request));
        continue;
      }
      a.last_token = token;
      still_active.push_back(std::move(a));
    }
    active = std::move(still_active);
  };

  Tensor logits;
  LAMINA_RETURN_IF_ERROR(engine.Prefill(prompts, /*all_positions=*/false, &logits));
  for (Active& a : active) a.next_position = static_cast<int32_t>(requests[a.request].prompt.size());
  advance(logits);

  std::vector<DecodeToken> batch;
  while (!active.empty()) {
    batch.clear();
    for (Active& a : active) batch.push_back({static_cast<SequenceId>(a.request), a.last_token, a.next_position++});
    LAMINA_RETURN_IF_ERROR(engine.Decode(batch, &logits));
    advance(logits);
  }
  return absl::OkStatus();
}

}  // namespace lamina
