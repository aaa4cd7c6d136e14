#include "deploy/bench/openai_sender.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/http/http_client.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace lamina::bench {
namespace {

using json = nlohmann::json;

absl::StatusCode CodeOfHttp(int status) {
  switch (status) {
    case 400:
    case 413:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 408:
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 502:
    case 503:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

// The server's message in an OpenAI error body ({"error": {"message": ...}}), else the body itself.
std::string ErrorMessage(const std::string& body) {
  const json reply = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (reply.is_object() && reply.contains("error")) {
    const json& error = reply["error"];
    if (error.is_object() && error.contains("message") && error["message"].is_string()) return error["message"];
    if (error.is_string()) return error;
  }
  return body.size() > 300 ? body.substr(0, 300) + "..." : body;
}

absl::Status HttpError(const std::string& address, int status, const std::string& body) {
  return absl::Status(CodeOfHttp(status), absl::StrCat(address, " answered HTTP ", status, ": ", ErrorMessage(body)));
}

// Complete server-sent events are taken off the front of `pending`; each event's data lines, joined.
std::vector<std::string> TakeEvents(std::string& pending) {
  std::vector<std::string> events;
  size_t end;
  while ((end = pending.find("\n\n")) != std::string::npos) {
    std::string data;
    for (absl::string_view line : absl::StrSplit(absl::string_view(pending).substr(0, end), '\n')) {
      if (!absl::ConsumePrefix(&line, "data:")) continue;  // comments, event names, ids
      absl::ConsumePrefix(&line, " ");
      absl::StrAppend(&data, data.empty() ? "" : "\n", line);
    }
    events.push_back(std::move(data));
    pending.erase(0, end + 2);
  }
  return events;
}

}  // namespace

absl::StatusOr<OpenAiUrl> ParseOpenAiUrl(const std::string& url) {
  OpenAiUrl parsed;
  absl::string_view rest = url;
  parsed.https = absl::ConsumePrefix(&rest, "https://");
  if (!parsed.https) absl::ConsumePrefix(&rest, "http://");
  absl::ConsumeSuffix(&rest, "/");
  absl::ConsumeSuffix(&rest, "/v1");  // an OpenAI SDK's base URL
  if (rest.empty() || rest.find('/') != absl::string_view::npos || rest.find(':') == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' is not an OpenAI-compatible server's address (http[s]://HOST:PORT)"));
  }
  parsed.address = std::string(rest);
  return parsed;
}

absl::StatusOr<OpenAiModel> FetchOpenAiModel(const std::string& address, absl::Duration timeout,
                                             const HttpClientOptions& options) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<HttpResponseStream> stream,
                          HttpResponseStream::Open(address, "GET", "/v1/models", "", "", absl::Now() + timeout, options));
  LAMINA_ASSIGN_OR_RETURN(std::string body, stream->ReadAll());
  if (stream->status() != 200) return HttpError(address, stream->status(), body);
  const json models = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!models.is_object() || !models.contains("data") || !models["data"].is_array() || models["data"].empty() ||
      !models["data"][0].is_object() || !models["data"][0].contains("id") || !models["data"][0]["id"].is_string()) {
    return absl::FailedPreconditionError(absl::StrCat(address, "/v1/models lists no model: ", ErrorMessage(body)));
  }
  const json& first = models["data"][0];
  OpenAiModel model;
  model.id = first["id"];
  if (first.contains("max_model_len") && first["max_model_len"].is_number_integer()) {
    model.max_context = first["max_model_len"].get<int>();
  }
  return model;
}

absl::Status OpenAiSender::Send(const BenchRequest& request, absl::Duration timeout,
                                const std::function<void(int)>& on_tokens, int* prompt_tokens) {
  json body = {{"model", model_},
               {"max_tokens", request.output_tokens},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true}};
  if (!request.prompt_ids.empty()) {
    body["prompt"] = request.prompt_ids;
  } else {
    body["prompt"] = request.prompt_text;
  }
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<HttpResponseStream> stream,
                          HttpResponseStream::Open(address_, "POST", "/v1/completions", body.dump(), "application/json",
                                                   absl::Now() + timeout, options_));
  if (stream->status() != 200) {
    LAMINA_ASSIGN_OR_RETURN(std::string reply, stream->ReadAll());
    return HttpError(address_, stream->status(), reply);
  }
  std::string pending;
  int counted = 0;
  for (;;) {
    LAMINA_ASSIGN_OR_RETURN(std::string piece, stream->Read());
    if (piece.empty()) {
      return absl::UnavailableError(absl::StrCat("the stream from ", address_, " ended without [DONE]"));
    }
    absl::StrAppend(&pending, absl::StrReplaceAll(piece, {{"\r", ""}}));
    for (const std::string& data : TakeEvents(pending)) {
      if (data == "[DONE]") return absl::OkStatus();
      const json event = json::parse(data, nullptr, /*allow_exceptions=*/false);
      if (!event.is_object()) return absl::DataLossError(absl::StrCat(address_, " streamed an event that is not JSON"));
      if (event.contains("error")) {
        return absl::UnavailableError(absl::StrCat(address_, " failed the request: ", ErrorMessage(data)));
      }
      if (event.contains("choices") && event["choices"].is_array() && !event["choices"].empty()) {
        const int tokens = static_cast<int>(event["choices"].size());
        counted += tokens;
        on_tokens(tokens);
      }
      if (event.contains("usage") && event["usage"].is_object()) {
        const json& usage = event["usage"];
        if (usage.value("prompt_tokens", json()).is_number_integer()) *prompt_tokens = usage["prompt_tokens"];
        if (usage.value("completion_tokens", json()).is_number_integer()) {
          const int completion = usage["completion_tokens"];
          if (completion != counted) on_tokens(completion - counted);
          counted = completion;
        }
      }
    }
  }
}

}  // namespace lamina::bench
