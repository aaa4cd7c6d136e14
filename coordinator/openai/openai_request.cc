#include "coordinator/openai/openai_request.h"

#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/json/json_depth.h"
#include "common/status/status_macros.h"
#include "compute_node/sampling/logprobs.h"
#include "compute_node/sampling/sampling_proto.h"
#include "nlohmann/json.hpp"

namespace lamina {
namespace {

using nlohmann::json;

constexpr absl::string_view kParamPayload = "lamina.openai.param";
constexpr int kMaxPrompts = 64;
constexpr int kMaxStops = 16;

absl::Status FieldError(const std::string& field, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat("'", field, "': ", message));
  status.SetPayload(kParamPayload, absl::Cord(field));
  return status;
}

// A value as an error message shows it: short, on one line.
std::string Shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// The fields of one JSON object, read by name with their types checked. Null counts as absent.
class Fields {
 public:
  Fields(const json& object, std::string prefix) : object_(object), prefix_(std::move(prefix)) {}

  std::string Name(absl::string_view field) const { return absl::StrCat(prefix_, field); }
  bool Has(const std::string& field) const { return object_.contains(field) && !object_.at(field).is_null(); }
  const json& Get(const std::string& field) const { return object_.at(field); }

  // Every key must be one of `known` (taken or refused later); the first other one is an error.
  absl::Status OnlyKnown(const std::set<std::string>& known) const {
    for (const auto& item : object_.items()) {
      if (!known.count(item.key())) return FieldError(Name(item.key()), "unknown field");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> Number(const std::string& field, double fallback) const {
    if (!Has(field)) return fallback;
    const json& value = Get(field);
    if (!value.is_number()) return FieldError(Name(field), absl::StrCat("expected a number, got ", Shown(value)));
    return value.get<double>();
  }

  absl::StatusOr<int64_t> Integer(const std::string& field, int64_t fallback, int64_t low, int64_t high) const {
    if (!Has(field)) return fallback;
    const json& value = Get(field);
    if (!value.is_number_integer()) {
      return FieldError(Name(field), absl::StrCat("expected an integer, got ", Shown(value)));
    }
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(high)) {
      return FieldError(Name(field),
                        absl::StrCat("expected an integer from ", low, " to ", high, ", got ", Shown(value)));
    }
    const int64_t number = value.get<int64_t>();
    if (number < low || number > high) {
      return FieldError(Name(field), absl::StrCat("expected an integer from ", low, " to ", high, ", got ", number));
    }
    return number;
  }

  absl::StatusOr<bool> Bool(const std::string& field, bool fallback) const {
    if (!Has(field)) return fallback;
    const json& value = Get(field);
    if (!value.is_boolean()) return FieldError(Name(field), absl::StrCat("expected true or false, got ", Shown(value)));
    return value.get<bool>();
  }

  absl::StatusOr<std::string> String(const std::string& field) const {
    if (!Has(field)) return std::string();
    const json& value = Get(field);
    if (!value.is_string()) return FieldError(Name(field), absl::StrCat("expected a string, got ", Shown(value)));
    return value.get<std::string>();
  }

 private:
  const json& object_;
  std::string prefix_;
};

bool IsTokenIds(const json& value) {
  if (!value.is_array() || value.empty()) return false;
  for (const json& id : value) {
    if (!id.is_number_integer()) return false;
  }
  return true;
}

absl::StatusOr<int32_t> TokenId(const json& value, const std::string& field) {
  if (value.is_number_unsigned()
          ? value.get<uint64_t>() > std::numeric_limits<int32_t>::max()
          : (value.get<int64_t>() < 0 || value.get<int64_t>() > std::numeric_limits<int32_t>::max())) {
    return FieldError(field, absl::StrCat("token id ", Shown(value), " is out of range"));
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

// /v1/completions' `prompt`: a string, strings, token ids, or lists of token ids.
absl::Status ParsePrompts(const Fields& fields, std::vector<lamina::v1::GenerateRequest>* prompts) {
  if (!fields.Has("prompt")) return FieldError("prompt", "missing");
  const json& prompt = fields.Get("prompt");
  auto add_ids = [&](const json& ids, const std::string& field) -> absl::Status {
    lamina::v1::GenerateRequest request;
    for (const json& id : ids) {
      LAMINA_ASSIGN_OR_RETURN(int32_t token, TokenId(id, field));
      request.mutable_token_ids()->add_ids(token);
    }
    prompts->push_back(std::move(request));
    return absl::OkStatus();
  };
  if (prompt.is_string()) {
    prompts->emplace_back().set_text(prompt.get<std::string>());
    return absl::OkStatus();
  }
  if (!prompt.is_array() || prompt.empty()) {
    return FieldError("prompt",
                      absl::StrCat("expected a string, strings, token ids or lists of token ids, got ", Shown(prompt)));
  }
  if (IsTokenIds(prompt)) return add_ids(prompt, "prompt");
  if (prompt.size() > kMaxPrompts) {
    return FieldError("prompt", absl::StrCat("at most ", kMaxPrompts, " prompts in one request, got ", prompt.size()));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string field = absl::StrCat("prompt[", i, "]");
    if (prompt[i].is_string()) {
      prompts->emplace_back().set_text(prompt[i].get<std::string>());
    } else if (IsTokenIds(prompt[i])) {
      LAMINA_RETURN_IF_ERROR(add_ids(prompt[i], field));
    } else {
      return FieldError(field, absl::StrCat("expected a string or a list of token ids, got ", Shown(prompt[i])));
    }
  }
  return absl::OkStatus();
}

// /v1/chat/completions' `messages`: roles with string content, or text parts.
absl::StatusOr<lamina::v1::Chat> ParseMessages(const Fields& fields) {
  if (!fields.Has("messages")) return FieldError("messages", "missing");
  const json& messages = fields.Get("messages");
  if (!messages.is_array() || messages.empty()) {
    return FieldError("messages", absl::StrCat("expected a list of messages, got ", Shown(messages)));
  }
  lamina::v1::Chat chat;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!messages[i].is_object())
      return FieldError(field, absl::StrCat("expected an object, got ", Shown(messages[i])));
    Fields message(messages[i], field + ".");
    for (const char* unsupported : {"tool_calls", "tool_call_id", "function_call"}) {
      if (message.Has(unsupported)) return FieldError(message.Name(unsupported), "not supported");
    }
    LAMINA_RETURN_IF_ERROR(
        message.OnlyKnown({"role", "content", "tool_calls", "tool_call_id", "function_call", "name"}));
    LAMINA_ASSIGN_OR_RETURN(std::string name, message.String("name"));
    (void)name;  // a participant's name: taken, type-checked, and not used (as vLLM)
    LAMINA_ASSIGN_OR_RETURN(std::string role, message.String("role"));
    if (role.empty()) return FieldError(message.Name("role"), "missing");
    lamina::v1::ChatMessage* out = chat.add_messages();
    out->set_role(role);
    if (!message.Has("content")) continue;  // an assistant's turn may have no content
    const json& content = message.Get("content");
    if (content.is_string()) {
      out->set_content(content.get<std::string>());
      continue;
    }
    if (!content.is_array()) {
      return FieldError(message.Name("content"), absl::StrCat("expected a string or text parts, got ", Shown(content)));
    }
    for (size_t p = 0; p < content.size(); ++p) {
      const std::string part_field = absl::StrCat(field, ".content[", p, "]");
      if (!content[p].is_object())
        return FieldError(part_field, absl::StrCat("expected an object, got ", Shown(content[p])));
      Fields part(content[p], part_field + ".");
      LAMINA_ASSIGN_OR_RETURN(std::string type, part.String("type"));
      if (type != "text") {
        return FieldError(part.Name("type"), absl::StrCat("'", type, "' is not supported: this model takes text only"));
      }
      LAMINA_RETURN_IF_ERROR(part.OnlyKnown({"type", "text"}));
      if (!part.Has("text")) return FieldError(part.Name("text"), "missing");
      LAMINA_ASSIGN_OR_RETURN(std::string text, part.String("text"));
      out->mutable_content()->append(text);
    }
  }
  return chat;
}

absl::StatusOr<std::vector<std::string>> ParseStops(const Fields& fields) {
  std::vector<std::string> stops;
  if (!fields.Has("stop")) return stops;
  const json& stop = fields.Get("stop");
  if (stop.is_string()) {
    stops.push_back(stop.get<std::string>());
  } else if (stop.is_array() && stop.size() <= kMaxStops) {
    for (const json& s : stop) {
      if (!s.is_string()) return FieldError("stop", absl::StrCat("expected strings, got ", Shown(s)));
      stops.push_back(s.get<std::string>());
    }
  } else {
    return FieldError("stop", absl::StrCat("expected a string or up to ", kMaxStops, " strings, got ", Shown(stop)));
  }
  for (const std::string& s : stops) {
    if (s.empty()) return FieldError("stop", "a stop string is empty");
  }
  return stops;
}

// Fields that would change what is generated and that Lamina cannot honour.
absl::Status RefuseUnsupported(const Fields& fields, int64_t n) {
  if (fields.Has("echo")) {
    LAMINA_ASSIGN_OR_RETURN(bool echo, fields.Bool("echo", false));
    if (echo) return FieldError("echo", "not supported");
  }
  if (fields.Has("suffix")) {
    LAMINA_ASSIGN_OR_RETURN(std::string suffix, fields.String("suffix"));
    if (!suffix.empty()) return FieldError("suffix", "not supported");
  }
  if (fields.Has("best_of")) {
    LAMINA_ASSIGN_OR_RETURN(int64_t best_of, fields.Integer("best_of", n, 1, 64));
    if (best_of != n) return FieldError("best_of", "not supported (other than equal to n)");
  }
  if (fields.Has("logit_bias") && !fields.Get("logit_bias").empty()) return FieldError("logit_bias", "not supported");
  for (const char* field : {"tools", "functions", "function_call"}) {
    if (fields.Has(field) && !fields.Get(field).empty()) {
      return FieldError(field, "not supported: Lamina does not call tools");
    }
  }
  if (fields.Has("tool_choice") && fields.Get("tool_choice") != "none" && fields.Get("tool_choice") != "auto") {
    return FieldError("tool_choice", "not supported: Lamina does not call tools");
  }
  if (fields.Has("response_format")) {
    const json& format = fields.Get("response_format");
    if (!format.is_object() || !format.contains("type") || format.at("type") != "text") {
      return FieldError("response_format", absl::StrCat("only {\"type\": \"text\"} is supported, got ", Shown(format)));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseSettings(OpenAiEndpoint endpoint, const Fields& fields, uint64_t seed,
                           lamina::v1::GenerateRequest* settings, OpenAiRequest* out) {
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  LAMINA_ASSIGN_OR_RETURN(int64_t n, fields.Integer("n", 1, 1, 64));
  LAMINA_RETURN_IF_ERROR(RefuseUnsupported(fields, n));
  settings->set_n(static_cast<int32_t>(n));

  const char* max_field = chat && fields.Has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  LAMINA_ASSIGN_OR_RETURN(int64_t max_tokens,
                          fields.Integer(max_field, chat ? 0 : 16, 1, std::numeric_limits<int32_t>::max()));
  settings->set_max_tokens(static_cast<int32_t>(max_tokens));

  SamplingParams sampling;
  LAMINA_ASSIGN_OR_RETURN(double temperature, fields.Number("temperature", 1.0));
  LAMINA_ASSIGN_OR_RETURN(double top_p, fields.Number("top_p", 1.0));
  LAMINA_ASSIGN_OR_RETURN(int64_t top_k, fields.Integer("top_k", 0, -1, std::numeric_limits<int32_t>::max()));
  LAMINA_ASSIGN_OR_RETURN(double min_p, fields.Number("min_p", 0.0));
  LAMINA_ASSIGN_OR_RETURN(double repetition, fields.Number("repetition_penalty", 1.0));
  LAMINA_ASSIGN_OR_RETURN(double presence, fields.Number("presence_penalty", 0.0));
  LAMINA_ASSIGN_OR_RETURN(double frequency, fields.Number("frequency_penalty", 0.0));
  LAMINA_ASSIGN_OR_RETURN(int64_t given_seed,
                          fields.Integer("seed", static_cast<int64_t>(seed), std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max()));
  sampling.temperature = static_cast<float>(temperature);
  sampling.top_p = static_cast<float>(top_p);
  sampling.top_k = static_cast<int32_t>(top_k < 0 ? 0 : top_k);  // vLLM's -1: no limit
  sampling.min_p = static_cast<float>(min_p);
  sampling.repetition_penalty = static_cast<float>(repetition);
  sampling.presence_penalty = static_cast<float>(presence);
  sampling.frequency_penalty = static_cast<float>(frequency);
  sampling.seed = static_cast<uint64_t>(given_seed);
  LAMINA_ASSIGN_OR_RETURN(int64_t min_tokens, fields.Integer("min_tokens", 0, 0, std::numeric_limits<int32_t>::max()));
  if (max_tokens > 0 && min_tokens > max_tokens) {
    return FieldError("min_tokens", absl::StrCat("must be at most ", max_field, " (", max_tokens, "), got ", min_tokens));
  }
  sampling.min_tokens = static_cast<int32_t>(min_tokens);
  if (chat) {
    LAMINA_ASSIGN_OR_RETURN(sampling.logprobs, fields.Bool("logprobs", false));
    LAMINA_ASSIGN_OR_RETURN(int64_t top, fields.Integer("top_logprobs", 0, 0, kMaxTopLogprobs));
    if (top > 0 && !sampling.logprobs) return FieldError("top_logprobs", "needs 'logprobs': true");
    sampling.top_logprobs = static_cast<int32_t>(top);
  } else if (fields.Has("logprobs")) {
    LAMINA_ASSIGN_OR_RETURN(int64_t top, fields.Integer("logprobs", 0, 0, kMaxTopLogprobs));
    sampling.logprobs = true;
    sampling.top_logprobs = static_cast<int32_t>(top);
  }
  if (absl::Status valid = sampling.Validate(); !valid.ok()) {
    const std::string message(valid.message());
    return FieldError(message.substr(0, message.find(' ')), message);
  }
  SamplingToProto(sampling, settings->mutable_sampling());

  LAMINA_ASSIGN_OR_RETURN(std::vector<std::string> stops, ParseStops(fields));
  for (const std::string& stop : stops) settings->add_stop_strings(stop);
  if (fields.Has("stop_token_ids")) {
    const json& ids = fields.Get("stop_token_ids");
    if (!ids.is_array() || (!ids.empty() && !IsTokenIds(ids))) {
      return FieldError("stop_token_ids", absl::StrCat("expected a list of token ids, got ", Shown(ids)));
    }
    for (const json& id : ids) {
      LAMINA_ASSIGN_OR_RETURN(int32_t token, TokenId(id, "stop_token_ids"));
      settings->add_stop_token_ids(token);
    }
  }
  LAMINA_ASSIGN_OR_RETURN(bool ignore_eos, fields.Bool("ignore_eos", false));
  settings->set_ignore_eos(ignore_eos);
  // Taken, type-checked, and not used (as vLLM): the end user, and OpenAI's storage and billing
  // settings.
  LAMINA_ASSIGN_OR_RETURN(std::string user, fields.String("user"));
  LAMINA_ASSIGN_OR_RETURN(std::string service_tier, fields.String("service_tier"));
  LAMINA_ASSIGN_OR_RETURN(bool store, fields.Bool("store", false));
  (void)user, (void)service_tier, (void)store;
  if (fields.Has("metadata") && !fields.Get("metadata").is_object() && !fields.Get("metadata").is_null()) {
    return FieldError("metadata", absl::StrCat("expected an object, got ", Shown(fields.Get("metadata"))));
  }

  LAMINA_ASSIGN_OR_RETURN(out->stream, fields.Bool("stream", false));
  if (fields.Has("stream_options")) {
    if (!out->stream) return FieldError("stream_options", "only allowed with 'stream': true");
    const json& options = fields.Get("stream_options");
    if (!options.is_object())
      return FieldError("stream_options", absl::StrCat("expected an object, got ", Shown(options)));
    Fields stream_options(options, "stream_options.");
    LAMINA_RETURN_IF_ERROR(stream_options.OnlyKnown({"include_usage"}));
    LAMINA_ASSIGN_OR_RETURN(out->include_usage, stream_options.Bool("include_usage", false));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body, uint64_t seed) {
  // Checked before parsing: a parser recurses once per level (kMaxJsonDepth in openai_request.h).
  if (absl::Status nesting = CheckJsonNesting(body, kMaxJsonDepth); !nesting.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the body is not accepted: ", nesting.message()));
  }
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // a parse error, or a number too large for a double
    const std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line 2, ..."
    const size_t at = what.find("] ");
    return absl::InvalidArgumentError(
        absl::StrCat("the body is not valid JSON: ", at == std::string::npos ? what : what.substr(at + 2)));
  }
  if (!parsed.is_object()) return absl::InvalidArgumentError("the body is not a JSON object");
  Fields fields(parsed, "");
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  std::set<std::string> known = {"model",
                                 "max_tokens",
                                 "temperature",
                                 "top_p",
                                 "n",
                                 "stop",
                                 "seed",
                                 "presence_penalty",
                                 "frequency_penalty",
                                 "stream",
                                 "stream_options",
                                 "logprobs",
                                 "user",
                                 "store",
                                 "metadata",
                                 "service_tier",
                                 "logit_bias",
                                 "top_k",
                                 "min_p",
                                 "repetition_penalty",
                                 "ignore_eos",
                                 "min_tokens",
                                 "stop_token_ids"};
  if (chat) {
    known.insert({"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions",
                  "function_call", "response_format", "parallel_tool_calls"});
  } else {
    known.insert({"prompt", "echo", "suffix", "best_of"});
  }
  LAMINA_RETURN_IF_ERROR(fields.OnlyKnown(known));

  OpenAiRequest out;
  out.endpoint = endpoint;
  LAMINA_ASSIGN_OR_RETURN(out.model, fields.String("model"));
  lamina::v1::GenerateRequest settings;
  LAMINA_RETURN_IF_ERROR(ParseSettings(endpoint, fields, seed, &settings, &out));
  if (chat) {
    LAMINA_ASSIGN_OR_RETURN(*settings.mutable_chat(), ParseMessages(fields));
    out.prompts.push_back(std::move(settings));
  } else {
    std::vector<lamina::v1::GenerateRequest> prompts;
    LAMINA_RETURN_IF_ERROR(ParsePrompts(fields, &prompts));
    for (lamina::v1::GenerateRequest& prompt : prompts) {
      lamina::v1::GenerateRequest request = settings;
      request.MergeFrom(prompt);
      out.prompts.push_back(std::move(request));
    }
  }
  return out;
}

absl::Status AboutField(absl::Status status, const std::string& field) {
  status.SetPayload(kParamPayload, absl::Cord(field));
  return status;
}

std::string ErrorParam(const absl::Status& status) {
  absl::optional<absl::Cord> param = status.GetPayload(kParamPayload);
  return param ? std::string(*param) : std::string();
}

}  // namespace lamina
