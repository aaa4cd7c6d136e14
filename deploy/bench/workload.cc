#include "deploy/bench/workload.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/yaml/yaml_fields.h"

namespace lamina::bench {
namespace {

absl::StatusOr<std::vector<LengthBin>> ParseBins(const YamlFields& f, const std::string& field) {
  if (!f.Has(field)) return f.Error(f.Get(field), field, "missing");
  YAML::Node list = f.Get(field);
  if (!list.IsSequence() || list.size() == 0) return f.Error(list, field, "expected a list of [first, last, weight]");
  std::vector<LengthBin> bins;
  double total = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node& bin = list[i];
    LengthBin b;
    bool ok = bin.IsSequence() && bin.size() == 3;
    try {
      if (ok) {
        b.first = bin[0].as<int>();
        b.last = bin[1].as<int>();
        b.weight = bin[2].as<double>();
      }
    } catch (const YAML::Exception&) {
      ok = false;
    }
    if (!ok || b.first < 1 || b.last < b.first || !(b.weight >= 0)) {
      return f.Error(bin, absl::StrCat(field, "[", i, "]"),
                     "expected [first, last, weight] with 1 <= first <= last and weight >= 0");
    }
    total += b.weight;
    bins.push_back(b);
  }
  if (total <= 0) return f.Error(list, field, "the weights sum to zero");
  for (LengthBin& b : bins) b.weight /= total;
  return bins;
}


}  // namespace

absl::StatusOr<LengthDistribution> LoadLengthDistribution(const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  YamlFields f(root, path, "", {"name", "prompt_tokens", "output_tokens"});
  LAMINA_RETURN_IF_ERROR(f.CheckShape());
  LengthDistribution d;
  d.path = path;
  const std::string fallback = std::filesystem::path(path).stem().string();
  LAMINA_ASSIGN_OR_RETURN(d.name, f.String("name", &fallback));
  LAMINA_ASSIGN_OR_RETURN(d.prompt_tokens, ParseBins(f, "prompt_tokens"));
  LAMINA_ASSIGN_OR_RETURN(d.output_tokens, ParseBins(f, "output_tokens"));
  return d;
}

int DrawLength(const std::vector<LengthBin>& bins, std::mt19937_64* rng) {
  double u = std::uniform_real_distribution<double>(0, 1)(*rng);
  const LengthBin* pick = &bins.back();
  for (const LengthBin& b : bins) {
    if (u < b.weight) {
      pick = &b;
      break;
    }
    u -= b.weight;
  }
  return std::uniform_int_distribution<int>(pick->first, pick->last)(*rng);
}

absl::Status WorkloadSpec::Validate() const {
  if (requests < 1) return absl::InvalidArgumentError("requests must be at least 1");
  if (mode == ArrivalMode::kClosedLoop && concurrency < 1) {
    return absl::InvalidArgumentError("concurrency must be at least 1");
  }
  if (mode == ArrivalMode::kOpenLoop && !(rate > 0)) {
    return absl::InvalidArgumentError("an open-loop workload needs a rate above 0 requests/s");
  }
  if (prompt_tokens < 1 || output_tokens < 1) {
    return absl::InvalidArgumentError("prompt_tokens and output_tokens must be at least 1");
  }
  if (!lengths.empty() && !prompts.empty()) {
    return absl::InvalidArgumentError("give a length distribution or a prompts file, not both");
  }
  if (ttft_target_ms < 0 || tpot_target_ms < 0) return absl::InvalidArgumentError("latency targets must be >= 0");
  if (!(request_timeout_s > 0)) return absl::InvalidArgumentError("request_timeout_s must be above 0");
  return absl::OkStatus();
}

absl::StatusOr<WorkloadSpec> LoadWorkload(const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  YamlFields f(root, path, "",
               {"mode", "concurrency", "rate", "requests", "prompt_tokens", "output_tokens", "lengths", "prompts",
                "seed", "ttft_target_ms", "tpot_target_ms", "request_timeout_s"});
  LAMINA_RETURN_IF_ERROR(f.CheckShape());
  WorkloadSpec w;
  const std::string closed = "closed";
  LAMINA_ASSIGN_OR_RETURN(std::string mode, f.String("mode", &closed));
  if (mode == "open") {
    w.mode = ArrivalMode::kOpenLoop;
  } else if (mode != "closed") {
    return f.Error(f.Get("mode"), "mode", absl::StrCat("expected 'closed' or 'open', got '", mode, "'"));
  }
  const int64_t defaults[] = {w.concurrency, w.requests, w.prompt_tokens, w.output_tokens, 1};
  LAMINA_ASSIGN_OR_RETURN(int64_t concurrency, f.Integer("concurrency", &defaults[0], 1, 1 << 20));
  LAMINA_ASSIGN_OR_RETURN(int64_t requests, f.Integer("requests", &defaults[1], 1, 1 << 24));
  LAMINA_ASSIGN_OR_RETURN(int64_t prompt_tokens, f.Integer("prompt_tokens", &defaults[2], 1, 1 << 24));
  LAMINA_ASSIGN_OR_RETURN(int64_t output_tokens, f.Integer("output_tokens", &defaults[3], 1, 1 << 24));
  LAMINA_ASSIGN_OR_RETURN(int64_t seed, f.Integer("seed", &defaults[4], 0, INT64_MAX));
  w.concurrency = static_cast<int>(concurrency);
  w.requests = static_cast<int>(requests);
  w.prompt_tokens = static_cast<int>(prompt_tokens);
  w.output_tokens = static_cast<int>(output_tokens);
  w.seed = static_cast<uint64_t>(seed);
  const double zero = 0, timeout = w.request_timeout_s;
  LAMINA_ASSIGN_OR_RETURN(w.rate, f.Double("rate", &zero, 0, 1e9));
  LAMINA_ASSIGN_OR_RETURN(w.ttft_target_ms, f.Double("ttft_target_ms", &zero, 0, 1e12));
  LAMINA_ASSIGN_OR_RETURN(w.tpot_target_ms, f.Double("tpot_target_ms", &zero, 0, 1e12));
  LAMINA_ASSIGN_OR_RETURN(w.request_timeout_s, f.Double("request_timeout_s", &timeout, 1e-3, 1e9));
  const std::string none;
  LAMINA_ASSIGN_OR_RETURN(std::string lengths, f.String("lengths", &none));
  LAMINA_ASSIGN_OR_RETURN(std::string prompts, f.String("prompts", &none));
  w.lengths = ResolveAgainstFile(lengths, path);
  w.prompts = ResolveAgainstFile(prompts, path);
  absl::Status valid = w.Validate();
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", valid.message()));
  return w;
}

absl::StatusOr<std::vector<BenchRequest>> MakeRequests(const WorkloadSpec& spec, int vocab_size, int max_context) {
  LAMINA_RETURN_IF_ERROR(spec.Validate());
  if (vocab_size < 1 || max_context < 2) return absl::InvalidArgumentError("the model has no vocabulary or context");
  std::mt19937_64 rng(spec.seed);
  LengthDistribution lengths;
  if (!spec.lengths.empty()) {
    LAMINA_ASSIGN_OR_RETURN(lengths, LoadLengthDistribution(spec.lengths));
  }
  std::vector<std::string> texts;
  if (!spec.prompts.empty()) {
    std::ifstream in(spec.prompts);
    if (!in) return absl::NotFoundError(absl::StrCat(spec.prompts, ": cannot open the prompts file"));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) texts.push_back(line);
    }
    if (texts.empty()) return absl::InvalidArgumentError(absl::StrCat(spec.prompts, ": has no prompts (one per line)"));
  }
  std::vector<BenchRequest> out(spec.requests);
  std::exponential_distribution<double> gap(spec.rate > 0 ? spec.rate : 1.0);
  std::uniform_int_distribution<int32_t> token(0, vocab_size - 1);
  double clock = 0;
  for (int i = 0; i < spec.requests; ++i) {
    BenchRequest& r = out[i];
    int prompt = spec.prompt_tokens;
    r.output_tokens = spec.output_tokens;
    if (!lengths.prompt_tokens.empty()) {
      prompt = DrawLength(lengths.prompt_tokens, &rng);
      r.output_tokens = DrawLength(lengths.output_tokens, &rng);
    }
    // Clip to the window: the output keeps at least one token, the prompt at least one.
    r.output_tokens = std::min(r.output_tokens, max_context - 1);
    prompt = std::max(1, std::min(prompt, max_context - r.output_tokens));
    if (!texts.empty()) {
      r.prompt_text = texts[i % texts.size()];
    } else {
      r.prompt_ids.resize(prompt);
      for (int32_t& id : r.prompt_ids) id = token(rng);
    }
    if (spec.mode == ArrivalMode::kOpenLoop) {
      clock += gap(rng);
      r.arrival_s = clock;
    }
  }
  return out;
}

}  // namespace lamina::bench
