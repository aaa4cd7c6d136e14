#include "coordinator/openai/openai_api.h"

#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "coordinator/api/generation_request.h"
#include "coordinator/metrics/metrics_page.h"
#include "coordinator/openai/openai_output.h"

namespace lamina {
namespace {

using json = nlohmann::ordered_json;

constexpr absl::string_view kJson = "application/json";

uint64_t RandomBits() {
  thread_local std::mt19937_64 bits(std::random_device{}());
  return bits();
}

std::string ResponseId(OpenAiEndpoint endpoint) {
  return absl::StrFormat("%s-%016x%08x", endpoint == OpenAiEndpoint::kChatCompletions ? "chatcmpl" : "cmpl",
                         RandomBits(), static_cast<uint32_t>(RandomBits()));
}

void SendJson(HttpResponder& responder, int status, const json& body) {
  (void)responder.Send(status, kJson, body.dump(-1, ' ', false, json::error_handler_t::replace));
}

void SendError(HttpResponder& responder, const absl::Status& status, const std::string& param = "",
               const std::string& code = "") {
  SendJson(responder, HttpStatusOf(status), ErrorJson(status, param, code));
}

// One HTTP request's generations (a request per prompt, n samples each): their events turned into
// choices, streamed as they come or gathered into one body.
class Run {
 public:
  Run(const OpenAiRequest& request, OpenAiResponseHeader header, std::vector<std::shared_ptr<RequestHandle>> handles,
      const Tokenizer& tokenizer, HttpResponder& responder)
      : request_(request),
        header_(std::move(header)),
        handles_(std::move(handles)),
        tokenizer_(tokenizer),
        responder_(responder),
        done_(handles_.size(), false) {
    for (const lamina::v1::GenerateRequest& prompt : request_.prompts) {
      first_choice_.push_back(static_cast<int>(choices_.size()));
      for (int k = 0; k < std::max(prompt.n(), 1); ++k) {
        ChoiceOutput choice;
        choice.index = static_cast<int>(choices_.size());
        choice.want_logprobs = prompt.sampling().logprobs() || prompt.sampling().top_logprobs() > 0;
        choices_.push_back(std::move(choice));
      }
    }
    characters_.assign(choices_.size(), 0);
  }

  // Returns once every request has ended, one has failed, or the client has gone.
  void Go() {
    if (request_.stream && !OpenStream()) return CancelAll();
    size_t open = handles_.size();
    while (open > 0) {
      bool any = false;
      for (size_t i = 0; i < handles_.size(); ++i) {
        if (done_[i]) continue;
        // Wait on the first open request only; look at the others without waiting.
        const absl::Duration wait = any ? absl::ZeroDuration() : absl::Milliseconds(open == 1 ? 50 : 5);
        RequestEvent event;
        if (!handles_[i]->Pop(&event, wait)) continue;
        any = true;
        if (!event.error.ok()) return Fail(event.error);
        if (event.done) {
          done_[i] = true;
          --open;
        }
        if (!Deliver(i, event)) return CancelAll();
      }
      if (responder_.ClientGone()) return CancelAll();
    }
    Finish();
  }

 private:
  bool Write(const std::string& bytes) { return responder_.Write(bytes).ok(); }

  bool OpenStream() {
    if (!responder_.StartStream(200, "text/event-stream").ok()) return false;
    if (header_.endpoint != OpenAiEndpoint::kChatCompletions) return true;
    for (const ChoiceOutput& choice : choices_) {
      ChoiceOutput opening;
      opening.index = choice.index;
      if (!Write(ServerSentEvent(ChunkBody(header_, opening, /*opening=*/true)))) return false;
    }
    return true;
  }

  // Adds one event to its choice; streamed, sends it as a chunk (and keeps only what the last
  // chunk and the usage need).
  bool Deliver(size_t prompt, const RequestEvent& event) {
    const int index = first_choice_[prompt] + event.index;
    ChoiceOutput& choice = choices_[index];
    ChoiceOutput delta;
    delta.index = choice.index;
    delta.text = event.text;
    delta.want_logprobs = choice.want_logprobs;
    delta.finish = event.finish;
    delta.text_offset = characters_[index];
    for (size_t t = 0; t < event.logprobs.size() && t < event.token_ids.size(); ++t) {
      delta.logprobs.push_back(WithTokenTexts(event.token_ids[t], event.logprobs[t], tokenizer_));
      characters_[index] += CharacterCount(delta.logprobs.back().token());
    }
    if (event.finish != FinishReason::kNone) {
      choice.finish = event.finish;
      usage_.completion_tokens += event.generated_tokens;
      if (event.index == 0) usage_.prompt_tokens += event.prompt_tokens;
    }
    if (!request_.stream) {
      choice.text += delta.text;
      choice.logprobs.insert(choice.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
      return true;
    }
    if (delta.text.empty() && delta.logprobs.empty() && delta.finish == FinishReason::kNone) return true;
    return Write(ServerSentEvent(ChunkBody(header_, delta)));
  }

  void Finish() {
    if (!request_.stream) {
      SendJson(responder_, 200, ResponseBody(header_, choices_, usage_));
      return;
    }
    if (request_.include_usage && !Write(ServerSentEvent(UsageChunkBody(header_, usage_)))) return;
    if (Write(std::string(kDoneEvent))) (void)responder_.EndStream();
  }

  void Fail(const absl::Status& status) {
    CancelAll();
    if (!responder_.started()) return SendError(responder_, status);
    if (Write(ServerSentEvent(ErrorJson(status))) && Write(std::string(kDoneEvent))) (void)responder_.EndStream();
  }

  void CancelAll() {
    for (const std::shared_ptr<RequestHandle>& handle : handles_) handle->Cancel();
  }

  const OpenAiRequest& request_;
  const OpenAiResponseHeader header_;
  const std::vector<std::shared_ptr<RequestHandle>> handles_;
  const Tokenizer& tokenizer_;
  HttpResponder& responder_;
  std::vector<bool> done_;
  std::vector<int> first_choice_;  // of each prompt
  std::vector<ChoiceOutput> choices_;
  std::vector<int64_t> characters_;  // of each choice's tokens so far: its next token's text_offset
  OpenAiUsage usage_;
};

}  // namespace

OpenAiApi::OpenAiApi(std::string model_name, const ModelConfig& config, const Tokenizer* tokenizer,
                     absl::StatusOr<ChatTemplate> chat_template, Scheduler* scheduler, Membership* membership,
                     ApiKeys keys, bool open_probes)
    : model_name_(std::move(model_name)),
      config_(config),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      scheduler_(scheduler),
      membership_(membership),
      keys_(std::move(keys)),
      open_probes_(open_probes),
      started_(absl::ToUnixSeconds(absl::Now())) {}

void OpenAiApi::Handle(const HttpRequest& request, HttpResponder& responder) {
  const std::string& path = request.path;
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  auto wrong_method = [&](const char* allowed) {
    SendJson(responder, 405,
             ErrorJson(absl::InvalidArgumentError(absl::StrCat(request.method, " ", path, ": use ", allowed))));
  };
  const bool probe = path == "/health" || path == "/metrics";
  if (keys_.enabled() && !(probe && open_probes_)) {
    const std::string* authorization = request.Header("authorization");
    if (authorization == nullptr || !keys_.Accepts(ApiKeys::FromBearer(*authorization))) {
      // OpenAI's answer to a missing or wrong key.
      return SendJson(responder, 401,
                      {{"error",
                        {{"message", "Incorrect API key provided: send 'Authorization: Bearer KEY'"},
                         {"type", "invalid_request_error"},
                         {"param", nullptr},
                         {"code", "invalid_api_key"}}}});
    }
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return wrong_method("POST");
    return Generate(path == "/v1/completions" ? OpenAiEndpoint::kCompletions : OpenAiEndpoint::kChatCompletions,
                    request, responder);
  }
  if (path == "/v1/models") {
    if (!get) return wrong_method("GET");
    return SendJson(responder, 200, ModelListJson(model_name_, started_, config_.max_position_embeddings));
  }
  if (absl::StartsWith(path, "/v1/models/")) {
    if (!get) return wrong_method("GET");
    const std::string id = path.substr(std::string("/v1/models/").size());
    if (id != model_name_) {
      return SendError(responder, absl::NotFoundError(absl::StrCat("the model '", id, "' does not exist")), "model",
                       "model_not_found");
    }
    return SendJson(responder, 200, ModelJson(model_name_, started_, config_.max_position_embeddings));
  }
  if (path == "/health") {
    if (!get) return wrong_method("GET");
    std::string why;
    if (membership_->AllAlive(&why)) return SendJson(responder, 200, {{"status", "serving"}});
    // Some node down: serving on the survivors (200), or not at all (503).
    if (membership_->CanServe()) return SendJson(responder, 200, {{"status", "degraded"}, {"detail", why}});
    return SendJson(responder, 503, {{"status", "not serving"}, {"detail", why}});
  }
  if (path == "/metrics") {
    if (!get) return wrong_method("GET");
    MetricsPageInputs inputs{model_name_,         scheduler_->pipelining(),     membership_->Snapshot(),
                             scheduler_->Stats(), scheduler_->metrics().Read(), absl::Now()};
    (void)responder.Send(200, kPrometheusContentType, RenderMetricsPage(inputs));
    return;
  }
  SendError(responder, absl::NotFoundError(absl::StrCat("no such endpoint: ", request.method, " ", path,
                                                        " (this server has /v1/completions, /v1/chat/completions, "
                                                        "/v1/models, /health and /metrics)")));
}

absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> OpenAiApi::Submit(const OpenAiRequest& request) {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  auto fail = [&](const absl::Status& status) {
    for (const std::shared_ptr<RequestHandle>& handle : handles) handle->Cancel();
    return status;
  };
  for (const lamina::v1::GenerateRequest& prompt : request.prompts) {
    absl::StatusOr<GenerationSpec> spec = ToGenerationSpec(prompt, *tokenizer_, chat_template_, config_);
    if (!spec.ok()) {
      scheduler_->CountRefused(spec.status().code());
      return fail(spec.status());
    }
    const int64_t prompt_tokens = static_cast<int64_t>(spec->prompt.size());
    if (spec->stop.max_tokens == 0) {  // a chat without max_tokens: the rest of the context
      spec->stop.max_tokens =
          static_cast<int32_t>(std::max<int64_t>(1, config_.max_position_embeddings - prompt_tokens));
    } else if (prompt_tokens < config_.max_position_embeddings &&
               prompt_tokens + spec->stop.max_tokens > config_.max_position_embeddings) {
      // As vLLM: a completion that cannot fit is refused rather than cut short.
      scheduler_->CountRefused(absl::StatusCode::kInvalidArgument);
      return fail(AboutField(
          absl::InvalidArgumentError(absl::StrCat(
              "this model's maximum context length is ", config_.max_position_embeddings, " tokens, but ",
              prompt_tokens, " prompt tokens and max_tokens ", spec->stop.max_tokens, " make ",
              prompt_tokens + spec->stop.max_tokens, "; lower max_tokens to at most ",
              config_.max_position_embeddings - prompt_tokens)),
          "max_tokens"));
    }
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle = scheduler_->Submit(*std::move(spec));
    if (!handle.ok()) return fail(handle.status());
    handles.push_back(*std::move(handle));
  }
  return handles;
}

void OpenAiApi::Generate(OpenAiEndpoint endpoint, const HttpRequest& request, HttpResponder& responder) {
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(endpoint, request.body, RandomBits());
  if (!parsed.ok()) return SendError(responder, parsed.status(), ErrorParam(parsed.status()));
  if (!parsed->model.empty() && parsed->model != model_name_) {
    return SendError(responder,
                     absl::NotFoundError(absl::StrCat("the model '", parsed->model,
                                                      "' does not exist; this server "
                                                      "serves '",
                                                      model_name_, "'")),
                     "model", "model_not_found");
  }
  absl::StatusOr<std::vector<std::shared_ptr<RequestHandle>>> handles = Submit(*parsed);
  if (!handles.ok()) return SendError(responder, handles.status(), ErrorParam(handles.status()));
  OpenAiResponseHeader header{endpoint, ResponseId(endpoint), absl::ToUnixSeconds(absl::Now()), model_name_};
  Run(*parsed, std::move(header), *std::move(handles), *tokenizer_, responder).Go();
}

}  // namespace lamina
