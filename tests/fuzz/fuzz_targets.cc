#include "tests/fuzz/fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "common/chat_template/chat_template.h"
#include "common/http/http_request.h"
#include "common/model_config/model_config.h"
#include "common/safetensors/safetensors_file.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "coordinator/api/generation_request.h"
#include "coordinator/openai/openai_request.h"
#include "google/protobuf/stubs/logging.h"

namespace lamina::fuzz {
namespace {

// A violated property aborts, which both libFuzzer and the mutation test report.
void Require(bool ok) {
  if (!ok) std::abort();
}

const Tokenizer& Loaded(const char* model) {
  static auto* cache = new std::map<std::string, std::unique_ptr<Tokenizer>>();
  auto& slot = (*cache)[model];
  if (!slot) {
    auto t = Tokenizer::Load(std::string(LAMINA_SOURCE_DIR) + "/tests/data/" + model);
    Require(t.ok());
    slot = std::make_unique<Tokenizer>(std::move(*t));
  }
  return *slot;
}

}  // namespace

bool SafetensorsFile(const uint8_t* data, size_t size) {
  auto tensors = lamina::SafetensorsFile::ParseBuffer(data, size, "fuzz.safetensors");
  if (!tensors.ok()) {
    Require(tensors.status().code() == absl::StatusCode::kInvalidArgument);
    return false;
  }
  // Every accepted tensor lies inside the buffer: touch its first and last byte.
  for (const auto& [name, view] : *tensors) {
    Require(view.data >= data && view.data + view.num_bytes <= data + size);
    if (view.num_bytes > 0) {
      volatile uint8_t first = view.data[0], last = view.data[view.num_bytes - 1];
      (void)first;
      (void)last;
    }
  }
  return true;
}

bool ModelConfigJson(const uint8_t* data, size_t size) {
  auto config = ParseModelConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  if (!config.ok()) {
    Require(config.status().code() == absl::StatusCode::kInvalidArgument);
    return false;
  }
  Require(config->num_q_heads % config->num_kv_heads == 0 && config->head_dim > 0);
  return true;
}

bool ChatTemplateSource(const uint8_t* data, size_t size) {
  auto chat = ChatTemplate::Create(std::string(reinterpret_cast<const char*>(data), size), "fuzz/chat_template",
                                   {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  if (!chat.ok()) {
    Require(chat.status().code() == absl::StatusCode::kInvalidArgument);
    return false;
  }
  auto text = chat->Apply({{"system", "Be brief."}, {"user", "Hi {{ there }}"}, {"assistant", "Hello."}}, true);
  Require(text.ok() || text.status().code() == absl::StatusCode::kInvalidArgument);
  return true;
}

bool HttpRequestHead(const uint8_t* data, size_t size) {
  constexpr size_t kMaxBody = 1 << 20;
  auto request = ParseRequestHead(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!request.ok()) {
    Require(absl::IsInvalidArgument(request.status()) || absl::IsUnimplemented(request.status()));
    return false;
  }
  Require(!request->method.empty() && request->target[0] == '/');
  Require(request->target.compare(0, request->path.size(), request->path) == 0);
  for (const auto& [name, value] : request->headers) {
    for (char c : name) Require(!(c >= 'A' && c <= 'Z'));
  }
  auto length = BodyLength(*request, kMaxBody);
  if (length.ok()) {
    Require(*length <= kMaxBody);
  } else {
    Require(absl::IsInvalidArgument(length.status()) || absl::IsOutOfRange(length.status()) ||
            absl::IsUnimplemented(length.status()));
  }
  return true;
}

bool OpenAiBody(const uint8_t* data, size_t size) {
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  bool accepted = false;
  for (OpenAiEndpoint endpoint : {OpenAiEndpoint::kCompletions, OpenAiEndpoint::kChatCompletions}) {
    auto request = ParseOpenAiRequest(endpoint, body, /*seed=*/1);
    if (!request.ok()) {
      Require(absl::IsInvalidArgument(request.status()));
      continue;
    }
    accepted = true;
    Require(!request->prompts.empty() && request->prompts.size() <= 64);
    for (const lamina::v1::GenerateRequest& prompt : request->prompts) {
      Require(prompt.n() >= 1 && prompt.n() <= 64 && prompt.max_tokens() >= 0);
      Require(endpoint == OpenAiEndpoint::kChatCompletions ? prompt.chat().messages_size() > 0 : !prompt.has_chat());
    }
  }
  return accepted;
}

bool GenerateRequestProto(const uint8_t* data, size_t size) {
  // Malformed UTF-8 in a string field is a refusal to parse, not news: no log line for each.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  static const ModelConfig* config = [] {
    auto c = LoadModelConfig(std::string(LAMINA_SOURCE_DIR) + "/deploy/models/lamina-demo-6m");
    Require(c.ok());
    return new ModelConfig(*c);
  }();
  static const Tokenizer* tokenizer = [] {
    auto t = Tokenizer::Load(std::string(LAMINA_SOURCE_DIR) + "/deploy/models/lamina-demo-6m");
    Require(t.ok());
    return new Tokenizer(std::move(*t));
  }();
  lamina::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return false;
  const absl::StatusOr<ChatTemplate> no_template = absl::NotFoundError("no chat template");
  absl::StatusOr<GenerationSpec> spec = ToGenerationSpec(request, *tokenizer, no_template, *config);
  if (!spec.ok()) {
    if (!absl::IsInvalidArgument(spec.status()) && !(request.has_chat() && absl::IsFailedPrecondition(spec.status()))) {
      std::fprintf(stderr, "GenerateRequestProto: unexpected %s\n", spec.status().ToString().c_str());
      std::abort();
    }
    return false;
  }
  Require(spec->n >= 1 && spec->n <= kMaxSamples);
  Require(static_cast<int64_t>(spec->stop_strings.size()) <= kMaxStopStrings);
  for (int32_t id : spec->stop.stop_ids) Require(id >= 0 && id < config->vocab_size);
  return true;
}

bool TokenizerJson(const uint8_t* data, size_t size) {
  auto tokenizer = Tokenizer::FromJson(std::string(reinterpret_cast<const char*>(data), size), "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return false;
  for (const char* text : {"Hello world", "  spaces  ", "caf\xc3\xa9 \xe6\x9d\xb1", ""}) {
    std::vector<int32_t> ids = tokenizer->Encode(text);
    std::string decoded = tokenizer->Decode(ids);
    Require(utf8::Sanitize(decoded) == decoded);
  }
  return true;
}

void TokenizerText(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool valid = utf8::Sanitize(text) == text;
  for (const char* model : {"tiny-llama3", "tiny-llama2"}) {
    const Tokenizer& tokenizer = Loaded(model);
    std::vector<int32_t> ids = tokenizer.Encode(text);
    for (int32_t id : ids) Require(id >= 0 && id < tokenizer.vocab_size());
    std::string decoded = tokenizer.Decode(ids);
    Require(utf8::Sanitize(decoded) == decoded);
    // The round trip holds for valid UTF-8 without special-token text (matched as special
    // tokens), and, for SentencePiece-style tokenizers, without a literal U+2581, which stands
    // for a space by design (Hugging Face decodes it the same way).
    const bool metaspace = std::string(model) == "tiny-llama2";
    if (valid && text.find('<') == std::string::npos &&
        !(metaspace && text.find("\xe2\x96\x81") != std::string::npos)) {
      Require(decoded == text);
    }
  }
}

}  // namespace lamina::fuzz
