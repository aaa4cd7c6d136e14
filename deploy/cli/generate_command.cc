#include "deploy/cli/generate_command.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cuda/device.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "common/threading/thread_pool.h"
#include "common/tokenizer/incremental_decoder.h"
#include "common/topology/kv_dtype.h"
#include "common/topology/topology.h"
#include "coordinator/embedded/local_cluster.h"
#include "deploy/cli/cluster_client.h"
#include "deploy/cli/ordered_printer.h"

namespace lamina::cli {

const char kGenerateUsage[] =
    "usage: lamina generate (--model DIR | --endpoint HOST:PORT | --topology FILE) [--prompt TEXT]...\n"
    "                       [--prompt-ids 1,2,3]... [options]\n"
    "  Generates continuations: with --model in this process (on the CPU, or the GPU that --device\n"
    "  names), with --endpoint on a running cluster. Several prompts run as one batch; with no\n"
    "  --prompt or --prompt-ids, prompts are read from standard input, one per line.\n"
    "options:\n"
    "  --device D         with --model: cpu (default) or cuda:N\n"
    "  --kv-dtype T       with --model: the KV cache's element type: auto (default: bfloat16 for a\n"
    "                     bfloat16 checkpoint or on a GPU, else float32), float32 (CPU) or bfloat16\n"
    "  --max-tokens N     tokens to generate per prompt (default 64)\n"
    "  --n N              samples per prompt, printed in turn; the prompt's KV is shared (default 1)\n"
    "  --temperature T    0 = greedy (default 0)\n"
    "  --top-k K          sample among the K most likely tokens (default 0 = all)\n"
    "  --top-p P          sample among the smallest set with probability >= P (default 1)\n"
    "  --seed S           random seed for sampling (default 0)\n"
    "  --ignore-eos       keep generating past the end-of-sequence token\n"
    "  --stop TEXT        stop when the text contains TEXT (repeatable; --endpoint only)\n"
    "  --print-ids        print generated token ids, one line per prompt, instead of text\n"
    "  --logprobs N       after each completion, a line per token: its log probability under the\n"
    "                     model (before temperature, top-k, top-p) and the N most likely tokens at\n"
    "                     its step (0 to 20)\n";

namespace {

// The completions that the model's context cut short, for a note once all are printed: a person
// who asked for more tokens than fit should learn why fewer came.
class ContextFullNotes {
 public:
  explicit ContextFullNotes(size_t samples) : samples_(samples) {}
  void Add(size_t slot) { slots_.push_back(slot); }
  // `limit`: the context length, or 0 when unknown (a remote cluster).
  void Print(int64_t limit) {
    std::fflush(stdout);  // after the completions, also where both go to one pipe
    std::sort(slots_.begin(), slots_.end());
    for (size_t slot : slots_) {
      std::string which = absl::StrCat("prompt ", slot / samples_ + 1);
      if (samples_ > 1) absl::StrAppend(&which, ", sample ", slot % samples_ + 1, ",");
      std::fprintf(stderr, "lamina generate: %s stopped before --max-tokens: the model's context%s is full\n",
                   which.c_str(), limit > 0 ? absl::StrCat(" of ", limit, " tokens").c_str() : "");
    }
  }

 private:
  size_t samples_;
  std::vector<size_t> slots_;
};

// One generated token's line of --logprobs output.
struct LogprobRow {
  int32_t id = 0;
  std::string text;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // the most likely tokens' text and log probability
};

// A token's text quoted, with control and invalid bytes escaped.
std::string Quoted(const std::string& text) { return absl::StrCat("\"", absl::Utf8SafeCEscape(text), "\""); }

// What follows a completion: a line per token, "  -0.0123  \" the\" (279)  top: \" the\" -0.0123 | ...".
std::string FormatLogprobs(const std::vector<LogprobRow>& rows) {
  std::string out;
  for (const LogprobRow& row : rows) {
    absl::StrAppendFormat(&out, "\n  %9.4f  %s (%d)", row.logprob, Quoted(row.text), row.id);
    for (size_t k = 0; k < row.top.size(); ++k) {
      absl::StrAppendFormat(&out, "%s%s %.4f", k == 0 ? "  top: " : " | ", Quoted(row.top[k].first), row.top[k].second);
    }
  }
  return out;
}

struct GenerateOptions {
  std::string model_dir;
  DeviceSpec device;
  std::string kv_dtype;
  std::string endpoint;
  std::vector<std::string> stop_strings;
  std::vector<std::vector<int32_t>> prompts;
  GenerationRequest defaults;
  bool print_ids = false;
};

bool WantsLogprobs(const GenerateOptions& options) { return options.defaults.sampling.wants_logprobs(); }

absl::StatusOr<GenerateOptions> ParseOptions(const std::vector<std::string>& args,
                                             Flags* flags_out) {
  LAMINA_ASSIGN_OR_RETURN(
      Flags flags, Flags::Parse(args,
                                {"model", "endpoint", "topology", "prompt", "prompt-ids", "max-tokens", "temperature",
                                 "top-k", "top-p", "seed", "stop", "n", "device", "kv-dtype", "logprobs"},
                                {"print-ids", "ignore-eos"}));
  GenerateOptions options;
  options.model_dir = flags.String("model", "");
  options.endpoint = flags.String("endpoint", "");
  if (options.endpoint.empty() && flags.Has("topology")) {
    LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(flags.String("topology", "")));
    options.endpoint = topology.coordinator_address();
  }
  if (options.model_dir.empty() == options.endpoint.empty()) {
    return absl::InvalidArgumentError(
        "give one of --model DIR (run here), or --endpoint HOST:PORT or --topology FILE (a running cluster)");
  }
  if (flags.Has("device")) {
    if (options.model_dir.empty()) return absl::InvalidArgumentError("--device needs --model");
    LAMINA_ASSIGN_OR_RETURN(options.device, ParseDevice(flags.String("device", "")));
  }
  options.kv_dtype = flags.String("kv-dtype", "auto");
  if (flags.Has("kv-dtype")) {
    if (options.model_dir.empty()) {
      return absl::InvalidArgumentError("--kv-dtype needs --model (a cluster's memory nodes set kv_dtype)");
    }
    // Checked before the model loads; the model's config only chooses what "auto" means.
    absl::Status valid = ChooseKvDtype(options.kv_dtype, ModelConfig{}, options.device.is_cuda).status();
    if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", valid.message()));
  }
  options.stop_strings = flags.All("stop");
  if (!options.stop_strings.empty() && options.endpoint.empty()) {
    return absl::InvalidArgumentError("--stop needs --endpoint");
  }
  LAMINA_ASSIGN_OR_RETURN(int64_t max_tokens, flags.Int("max-tokens", 64));
  LAMINA_ASSIGN_OR_RETURN(double temperature, flags.Double("temperature", 0.0));
  LAMINA_ASSIGN_OR_RETURN(int64_t top_k, flags.Int("top-k", 0));
  LAMINA_ASSIGN_OR_RETURN(double top_p, flags.Double("top-p", 1.0));
  LAMINA_ASSIGN_OR_RETURN(int64_t seed, flags.Int("seed", 0));
  if (max_tokens < 1) return absl::InvalidArgumentError("--max-tokens must be at least 1");
  options.defaults.max_tokens = static_cast<int32_t>(max_tokens);
  LAMINA_ASSIGN_OR_RETURN(int64_t n, flags.Int("n", 1));
  if (n < 1 || n > 64) return absl::InvalidArgumentError("--n must be from 1 to 64");
  options.defaults.n = static_cast<int32_t>(n);
  options.defaults.sampling = {static_cast<float>(temperature), static_cast<int32_t>(top_k),
                               static_cast<float>(top_p), static_cast<uint64_t>(seed)};
  absl::Status sampling = options.defaults.sampling.Validate();
  if (!sampling.ok()) return absl::InvalidArgumentError(std::string(sampling.message()));
  if (flags.Has("logprobs")) {
    LAMINA_ASSIGN_OR_RETURN(int64_t top, flags.Int("logprobs", 0));
    if (top < 0 || top > kMaxTopLogprobs) {
      return absl::InvalidArgumentError(absl::StrCat("--logprobs must be from 0 to ", kMaxTopLogprobs));
    }
    options.defaults.sampling.logprobs = true;
    options.defaults.sampling.top_logprobs = static_cast<int32_t>(top);
  }
  options.defaults.ignore_eos = flags.Has("ignore-eos");
  options.print_ids = flags.Has("print-ids");
  for (const std::string& ids : flags.All("prompt-ids")) {
    LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> parsed, ParseIdList("prompt-ids", ids));
    options.prompts.push_back(std::move(parsed));
  }
  *flags_out = std::move(flags);
  return options;
}

absl::StatusOr<std::vector<std::string>> PromptTexts(const Flags& flags) {
  std::vector<std::string> texts = flags.All("prompt");
  if (texts.empty() && !flags.Has("prompt-ids")) {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty()) texts.push_back(line);
    }
    if (texts.empty()) return absl::InvalidArgumentError("no prompts: pass --prompt TEXT or lines on standard input");
  }
  return texts;
}

// Each prompt is its own streaming call; the cluster batches them.
absl::Status GenerateRemote(const GenerateOptions& options, const std::vector<std::string>& texts) {
  std::vector<lamina::v1::GenerateRequest> requests;
  for (const std::string& text : texts) {
    requests.emplace_back();
    requests.back().set_text(text);
  }
  for (const std::vector<int32_t>& ids : options.prompts) {
    requests.emplace_back();
    for (int32_t id : ids) requests.back().mutable_token_ids()->add_ids(id);
  }
  for (auto& r : requests) {
    r.set_max_tokens(options.defaults.max_tokens);
    r.set_n(options.defaults.n);
    r.set_ignore_eos(options.defaults.ignore_eos);
    r.mutable_sampling()->set_temperature(options.defaults.sampling.temperature);
    r.mutable_sampling()->set_top_k(options.defaults.sampling.top_k);
    r.mutable_sampling()->set_top_p(options.defaults.sampling.top_p);
    r.mutable_sampling()->set_seed(options.defaults.sampling.seed);
    r.mutable_sampling()->set_logprobs(options.defaults.sampling.logprobs);
    r.mutable_sampling()->set_top_logprobs(options.defaults.sampling.top_logprobs);
    for (const std::string& stop : options.stop_strings) r.add_stop_strings(stop);
  }
  // One output slot per sample, prompt-major.
  const size_t n = static_cast<size_t>(options.defaults.n);
  ClusterClient client(options.endpoint);
  OrderedPrinter printer(requests.size() * n, stdout);
  std::mutex printer_mu;
  std::vector<absl::Status> results(requests.size());
  ContextFullNotes notes(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      std::vector<std::vector<int32_t>> ids(n);
      std::vector<std::vector<LogprobRow>> logprobs(n);
      std::vector<bool> finished(n, false);
      results[i] = client.Generate(requests[i], [&](const lamina::v1::GenerateResponse& response) {
        std::lock_guard<std::mutex> lock(printer_mu);
        const size_t sample = static_cast<size_t>(response.index()) < n ? response.index() : 0;
        const size_t slot = i * n + sample;
        if (options.print_ids) {
          ids[sample].insert(ids[sample].end(), response.token_ids().begin(), response.token_ids().end());
        } else {
          printer.Write(slot, response.text());
        }
        for (int t = 0; t < response.logprobs_size() && t < response.token_ids_size(); ++t) {
          const lamina::v1::TokenLogprobs& got = response.logprobs(t);
          LogprobRow row{response.token_ids(t), got.token(), got.logprob(), {}};
          for (const auto& top : got.top()) row.top.emplace_back(top.token(), top.logprob());
          logprobs[sample].push_back(std::move(row));
        }
        if (response.finish_reason() == lamina::v1::FINISH_REASON_CONTEXT_FULL) notes.Add(slot);
        if (response.finish_reason() != lamina::v1::FINISH_REASON_UNSPECIFIED) {
          if (options.print_ids) printer.Write(slot, absl::StrJoin(ids[sample], " "));
          if (WantsLogprobs(options)) printer.Write(slot, FormatLogprobs(logprobs[sample]));
          printer.Finish(slot);
          finished[sample] = true;
        }
      });
      std::lock_guard<std::mutex> lock(printer_mu);
      for (size_t k = 0; k < n; ++k) {
        if (!finished[k]) printer.Finish(i * n + k);  // ended by an error
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      return absl::Status(results[i].code(), absl::StrCat("request ", i + 1, ": ", results[i].message()));
    }
  }
  notes.Print(/*limit=*/0);
  return absl::OkStatus();
}

absl::Status Generate(const std::vector<std::string>& args) {
  Flags flags;
  LAMINA_ASSIGN_OR_RETURN(GenerateOptions options, ParseOptions(args, &flags));
  LAMINA_ASSIGN_OR_RETURN(std::vector<std::string> texts, PromptTexts(flags));
  if (!options.endpoint.empty()) return GenerateRemote(options, texts);
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, LocalCluster::Load(options.model_dir, &ThreadPool::Default(), options.device));
  LAMINA_RETURN_IF_ERROR(cluster->SetKvDtype(options.kv_dtype));
  const Tokenizer& tokenizer = cluster->tokenizer();

  // Text prompts first, then id prompts, each in the order given.
  std::vector<GenerationRequest> requests;
  for (const std::string& text : texts) {
    requests.push_back(options.defaults);
    requests.back().prompt = tokenizer.EncodePrompt(text);
  }
  for (std::vector<int32_t>& ids : options.prompts) {
    requests.push_back(options.defaults);
    requests.back().prompt = std::move(ids);
  }

  // One output slot per sample, prompt-major.
  const size_t n = static_cast<size_t>(options.defaults.n);
  OrderedPrinter printer(requests.size() * n, stdout);
  std::vector<IncrementalDecoder> decoders(requests.size() * n, IncrementalDecoder(&tokenizer, /*at_text_start=*/false));
  std::vector<std::vector<int32_t>> generated(requests.size() * n);
  std::vector<std::vector<LogprobRow>> logprobs(requests.size() * n);
  ContextFullNotes notes(n);
  LAMINA_RETURN_IF_ERROR(cluster->Generate(requests, [&](const TokenEvent& event) {
    const size_t slot = event.request * n + static_cast<size_t>(event.sample);
    if (event.finish == FinishReason::kContextFull) notes.Add(slot);
    if (event.logprobs != nullptr) {
      const TokenLogprobs& got = *event.logprobs;
      LogprobRow row{event.token, tokenizer.TokenText(event.token), got.logprob, {}};
      for (int32_t k = 0; k < got.top_count; ++k) {
        row.top.emplace_back(tokenizer.TokenText(got.top_ids[k]), got.top_logprobs[k]);
      }
      logprobs[slot].push_back(std::move(row));
    }
    if (options.print_ids) {
      generated[slot].push_back(event.token);
    } else {
      printer.Write(slot, decoders[slot].Add(event.token));
    }
    if (event.finish != FinishReason::kNone) {
      printer.Write(slot, options.print_ids ? absl::StrJoin(generated[slot], " ") : decoders[slot].Finish());
      if (WantsLogprobs(options)) printer.Write(slot, FormatLogprobs(logprobs[slot]));
      printer.Finish(slot);
    }
  }));
  notes.Print(cluster->config().max_position_embeddings);
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  absl::Status status = Generate(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina generate: %s\n", std::string(status.message()).c_str());
  if (status.code() == absl::StatusCode::kInvalidArgument && status.message().find("--") != absl::string_view::npos) {
    std::fprintf(stderr, "%s", kGenerateUsage);
    return 2;
  }
  return 1;
}

}  // namespace lamina::cli
