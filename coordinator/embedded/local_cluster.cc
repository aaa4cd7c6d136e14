#include "coordinator/embedded/local_cluster.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/model_tokenizer.h"
#include "compute_node/engine/compute_engine.h"
#include "compute_node/sampling/penalties.h"
#include "coordinator/sequence/text_stream.h"
#include "compute_node/local/local_pool.h"
#include "compute_node/local/placed_attention.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Load(const std::string& model_dir, ThreadPool* pool,
                                                                 const DeviceSpec& device) {
  LAMINA_RETURN_IF_ERROR(UseDevice(device));  // before the (long) load: a missing GPU fails fast
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, ModelWeights::Load(model_dir));
  return Create(std::move(weights), model_dir, pool, device);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Create(std::unique_ptr<ModelWeights> weights,
                                                                   const std::string& tokenizer_dir, ThreadPool* pool,
                                                                   const DeviceSpec& device) {
  LAMINA_ASSIGN_OR_RETURN(Tokenizer tokenizer, LoadModelTokenizer(tokenizer_dir, weights->config));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> on_device, DeviceWeights::FromHost(device, std::move(weights)));
  return std::unique_ptr<LocalCluster>(
      new LocalCluster(std::move(on_device), std::make_unique<Tokenizer>(std::move(tokenizer)), pool));
}

absl::Status LocalCluster::SetKvDtype(std::string_view setting) {
  LAMINA_ASSIGN_OR_RETURN(kv_dtype_, ChooseKvDtype(setting, config(), weights_->device().is_cuda));
  return absl::OkStatus();
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
    if (req.n < 1 || req.n > 64) return absl::InvalidArgumentError(absl::StrCat(which, "n must be from 1 to 64, got ", req.n));
    absl::Status sampling = req.sampling.Validate();
    if (!sampling.ok()) return absl::InvalidArgumentError(which + std::string(sampling.message()));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Generate(absl::Span<const GenerationRequest> requests, const TokenCallback& on_token) {
  LAMINA_RETURN_IF_ERROR(Validate(requests));
  if (requests.empty()) return absl::OkStatus();
  const ModelConfig& c = config();

  // A pool with exactly the slots these requests can use: each prompt once, plus every sample's
  // tokens. Nothing is overcommitted.
  int64_t slots = 0;
  for (const GenerationRequest& req : requests) {
    const int64_t prompt = static_cast<int64_t>(req.prompt.size());
    slots += prompt + req.n * std::min<int64_t>(req.max_tokens, c.max_position_embeddings - prompt);
  }
  const DeviceSpec& device = weights_->device();
  // The engine's own pool, attended in this process (on a GPU, each decode step one CUDA graph).
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<LocalPool> kv_pool,
                          LocalPool::Create({c.num_layers,
                                             slots,
                                             {c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window},
                                             device.is_cuda ? device.index : -1,
                                             kv_dtype_},
                                            pool_));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<PlacedAttention> attention,
                          PlacedAttention::Create(kv_pool.get(), "local", nullptr));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ComputeEngine> engine_owner, weights_->MakeEngine(attention.get(), pool_));
  ComputeEngine& engine = *engine_owner;

  // One sample of one request: a sequence of its own.
  struct Active {
    size_t request;
    int32_t sample;
    SequenceId seq;
    SamplingParams sampling;  // seed + sample
    int32_t last_token = 0;
    int32_t next_position = 0;  // where last_token is fed back
    int32_t generated = 0;
    std::unique_ptr<TokenHistory> history = nullptr;  // what the penalties count, when the sampling has them
    std::unique_ptr<TextStream> text = nullptr;       // its text so far, watched for stop strings
  };
  // Reports a sampled token; false when the sample finished (its slots are freed).
  auto record = [&](Active& a, int32_t token, const TokenLogprobs& logprobs) {
    const GenerationRequest& req = requests[a.request];
    ++a.generated;
    a.last_token = token;
    if (a.history != nullptr) a.history->Add(a.next_position, token);
    bool stopped = false;
    std::string text = a.text->Add(token, &stopped);
    const FinishReason finish =
        stopped ? FinishReason::kStopString
                : CheckFinish(token, a.generated, a.next_position, {req.max_tokens, req.ignore_eos, req.stop_ids}, c);
    if (finish != FinishReason::kNone && !stopped) text += a.text->Finish();
    on_token({a.request, a.sample, token, finish, a.sampling.wants_logprobs() ? &logprobs : nullptr, text});
    if (finish == FinishReason::kNone) return true;
    attention->Free(a.seq);
    return false;
  };

  std::vector<PrefillSequence> prompts;
  for (size_t r = 0; r < requests.size(); ++r) prompts.push_back({static_cast<SequenceId>(r), requests[r].prompt});

  // Every sample draws its first token from its prompt's logits; samples beyond the first share
  // the prompt's slots (forked after the prefill, before the first sample may finish and free them).
  std::vector<Active> samples;
  std::vector<TokenDraw> draws;
  SequenceId next_seq = static_cast<SequenceId>(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    const int32_t prompt = static_cast<int32_t>(requests[r].prompt.size());
    for (int32_t k = 0; k < requests[r].n; ++k) {
      SamplingParams params = requests[r].sampling;
      params.seed += k;
      const SequenceId seq = k == 0 ? static_cast<SequenceId>(r) : next_seq++;
      samples.push_back({r, k, seq, params});
      Active& sample = samples.back();
      sample.next_position = prompt;
      sample.text = std::make_unique<TextStream>(tokenizer_.get(), requests[r].stop_strings);
      if (params.has_penalties()) {
        sample.history = std::make_unique<TokenHistory>(prompt);
        for (int32_t t = 0; t < prompt; ++t) sample.history->Add(t, requests[r].prompt[t]);
      }
      draws.push_back({static_cast<int64_t>(r), params, static_cast<uint64_t>(prompt), sample.history.get()});
    }
  }
  std::vector<int32_t> tokens(draws.size());
  std::vector<TokenLogprobs> logprobs(draws.size());
  LAMINA_RETURN_IF_ERROR(engine.Prefill(prompts, draws, tokens.data(), logprobs.data()));
  for (const Active& a : samples) {
    if (a.sample > 0) {
      LAMINA_RETURN_IF_ERROR(kv_pool->With([&](AttentionExecutor& e) {
        return e.Fork(static_cast<SequenceId>(a.request), a.seq, a.next_position);
      }));
    }
  }
  std::vector<Active> active;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (record(samples[i], tokens[i], logprobs[i])) active.push_back(std::move(samples[i]));
  }

  std::vector<DecodeToken> batch;
  while (!active.empty()) {
    batch.clear();
    draws.clear();
    for (Active& a : active) {
      draws.push_back({static_cast<int64_t>(batch.size()), a.sampling, static_cast<uint64_t>(a.next_position) + 1,
                       a.history.get()});
      batch.push_back({a.seq, a.last_token, a.next_position++});
    }
    tokens.resize(draws.size());
    logprobs.resize(draws.size());
    LAMINA_RETURN_IF_ERROR(engine.Decode(batch, draws, tokens.data(), logprobs.data()));
    std::vector<Active> still_active;
    for (size_t i = 0; i < active.size(); ++i) {
      if (record(active[i], tokens[i], logprobs[i])) still_active.push_back(std::move(active[i]));
    }
    active = std::move(still_active);
  }
  return absl::OkStatus();
}

}  // namespace lamina
