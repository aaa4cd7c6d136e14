#include "deploy/cli/bench_command.h"

#include <cstdio>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "common/topology/topology.h"
#include "deploy/bench/bench_runner.h"
#include "deploy/bench/openai_sender.h"
#include "deploy/cost/price_table.h"

namespace lamina::cli {

const char kBenchUsage[] =
    "usage: lamina bench (--endpoint HOST:PORT | --topology FILE | --openai URL) [workload flags] [--json FILE]\n"
    "  Sends a workload to a running cluster and reports tokens/s in and out, time to first token\n"
    "  and per output token (p50/p90/p99), goodput under latency targets, each node's busy share,\n"
    "  KV occupancy and the per-layer round trip.\n"
    "server:\n"
    "  --endpoint HOST:PORT  a Lamina cluster's gRPC endpoint (or --topology FILE: its coordinator)\n"
    "  --openai URL          send the requests over OpenAI's HTTP API instead (http[s]://HOST:PORT),\n"
    "                        Lamina's (its http_port; with --endpoint or --topology the cluster's\n"
    "                        figures still come) or any OpenAI-compatible server's, e.g. vLLM's\n"
    "  --model NAME          the model the requests name (default: the server's first)\n"
    "  --vocab-size N        --openai without a Lamina endpoint: the model's vocabulary, for random\n"
    "                        prompt ids\n"
    "  --max-context N       and its context, when the server's /v1/models does not give max_model_len\n"
    "  --api-key KEY         the server's API key (default: the LAMINA_API_KEY environment variable)\n"
    "  --tls-ca FILE         TLS (gRPC, and https URLs) trusting FILE's certificates (default:\n"
    "                        LAMINA_TLS_CA; with --topology, its coordinator.tls)\n"
    "  --tls                 TLS to the gRPC endpoint, trusting the system's certificates\n"
    "workload (flags override --workload FILE, a YAML file with the same fields):\n"
    "  --requests N          requests to send (64)\n"
    "  --concurrency C       closed loop: C requests in flight (8)\n"
    "  --rate R              open loop instead: Poisson arrivals at R requests/s\n"
    "  --prompt-tokens N     fixed prompt length (128); prompts are random token ids\n"
    "  --output-tokens N     fixed output length (64); generation ignores end-of-sequence\n"
    "  --lengths FILE        draw both lengths from a distribution (deploy/workloads/sharegpt-like.yaml)\n"
    "  --prompts FILE        prompts from a text file, one per line\n"
    "  --ttft-target-ms MS   goodput counts requests with time to first token <= MS ...\n"
    "  --tpot-target-ms MS   ... and time per output token <= MS\n"
    "  --seed N              random stream of lengths, prompts and arrivals (1)\n"
    "  --timeout S           a request not done in S seconds fails (600)\n"
    "output:\n"
    "  --json FILE           also write the figures as JSON\n"
    "  --prices FILE         price table for tokens/s per $/h (default deploy/prices/devices.yaml);\n"
    "                        needs --topology, whose nodes name their `kind`\n"
    "  --quiet               no progress line\n";

namespace {

absl::Status ApplyFlags(const Flags& flags, bench::WorkloadSpec* w) {
  LAMINA_ASSIGN_OR_RETURN(int64_t requests, flags.Int("requests", w->requests));
  LAMINA_ASSIGN_OR_RETURN(int64_t concurrency, flags.Int("concurrency", w->concurrency));
  LAMINA_ASSIGN_OR_RETURN(int64_t prompt_tokens, flags.Int("prompt-tokens", w->prompt_tokens));
  LAMINA_ASSIGN_OR_RETURN(int64_t output_tokens, flags.Int("output-tokens", w->output_tokens));
  LAMINA_ASSIGN_OR_RETURN(int64_t seed, flags.Int("seed", static_cast<int64_t>(w->seed)));
  LAMINA_ASSIGN_OR_RETURN(w->rate, flags.Double("rate", w->rate));
  LAMINA_ASSIGN_OR_RETURN(w->ttft_target_ms, flags.Double("ttft-target-ms", w->ttft_target_ms));
  LAMINA_ASSIGN_OR_RETURN(w->tpot_target_ms, flags.Double("tpot-target-ms", w->tpot_target_ms));
  LAMINA_ASSIGN_OR_RETURN(w->request_timeout_s, flags.Double("timeout", w->request_timeout_s));
  w->requests = static_cast<int>(requests);
  w->concurrency = static_cast<int>(concurrency);
  w->prompt_tokens = static_cast<int>(prompt_tokens);
  w->output_tokens = static_cast<int>(output_tokens);
  w->seed = static_cast<uint64_t>(seed);
  if (flags.Has("rate")) w->mode = bench::ArrivalMode::kOpenLoop;
  if (flags.Has("concurrency")) w->mode = bench::ArrivalMode::kClosedLoop;
  if (flags.Has("rate") && flags.Has("concurrency")) {
    return absl::InvalidArgumentError("--rate (open loop) and --concurrency (closed loop) exclude each other");
  }
  w->lengths = flags.String("lengths", w->lengths);
  w->prompts = flags.String("prompts", w->prompts);
  return w->Validate();
}

absl::Status Bench(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(
      Flags flags, Flags::Parse(args, {"endpoint",       "topology",      "openai",   "model",       "vocab-size",
                                       "max-context",    "workload",      "requests", "concurrency", "rate",
                                       "prompt-tokens",  "output-tokens", "lengths",  "prompts",     "ttft-target-ms",
                                       "tpot-target-ms", "seed",          "timeout",  "json",        "prices",
                                       "api-key",        "tls-ca"},
                                {"quiet", "tls"}));
  bench::WorkloadSpec workload;
  if (flags.Has("workload")) {
    LAMINA_ASSIGN_OR_RETURN(workload, bench::LoadWorkload(flags.String("workload", "")));
  }
  LAMINA_RETURN_IF_ERROR(ApplyFlags(flags, &workload));

  std::string endpoint = flags.String("endpoint", "");
  double hourly_usd = 0;
  std::string cost_line;
  ClientAccess access = AccessFromFlags(flags, nullptr);
  if (flags.Has("topology")) {
    LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(flags.String("topology", "")));
    if (endpoint.empty()) endpoint = topology.coordinator_address();
    access = AccessFromFlags(flags, &topology);
    const std::string prices = flags.String("prices", DefaultPriceTablePath());
    if (!prices.empty()) {
      LAMINA_ASSIGN_OR_RETURN(PriceTable table, LoadPriceTable(prices));
      LAMINA_ASSIGN_OR_RETURN(TopologyCost cost, PriceTopology(topology, table));
      hourly_usd = cost.hourly_usd;
      for (const auto& line : cost.lines) {
        absl::StrAppend(&cost_line, cost_line.empty() ? "" : " + ", line.devices, " x ", line.kind, " at $",
                        line.hourly_usd_each, "/h");
      }
    }
  } else if (flags.Has("prices")) {
    return absl::InvalidArgumentError("--prices needs --topology (its nodes name the device kinds to price)");
  }
  if (endpoint.empty() && !flags.Has("openai")) {
    return absl::InvalidArgumentError("--endpoint HOST:PORT, --topology FILE or --openai URL is required");
  }

  std::unique_ptr<ClusterClient> client;
  if (!endpoint.empty()) {
    LAMINA_ASSIGN_OR_RETURN(client, ClusterClient::Connect(endpoint, access));
  }
  std::unique_ptr<bench::RequestSender> sender;
  bench::BenchTarget target;
  target.cluster = client.get();
  if (flags.Has("openai")) {
    LAMINA_ASSIGN_OR_RETURN(bench::OpenAiUrl url, bench::ParseOpenAiUrl(flags.String("openai", "")));
    const std::string& address = url.address;
    HttpClientOptions http;
    http.api_key = access.api_key;
    if (url.https) {
      LAMINA_ASSIGN_OR_RETURN(http.tls, TlsContext::ForClient(access.tls.ca_file));
    }
    LAMINA_ASSIGN_OR_RETURN(bench::OpenAiModel model, bench::FetchOpenAiModel(address, absl::Seconds(10), http));
    LAMINA_ASSIGN_OR_RETURN(int64_t vocab_size, flags.Int("vocab-size", 0));
    LAMINA_ASSIGN_OR_RETURN(int64_t max_context, flags.Int("max-context", model.max_context));
    target.vocab_size = static_cast<int>(vocab_size);
    target.max_context = static_cast<int>(max_context);
    sender =
        std::make_unique<bench::OpenAiSender>(address, flags.String("model", model.id), http);
  } else {
    if (flags.Has("model") || flags.Has("vocab-size") || flags.Has("max-context")) {
      return absl::InvalidArgumentError("--model, --vocab-size and --max-context go with --openai");
    }
    sender = std::make_unique<bench::GrpcSender>(client.get());
  }
  target.sender = sender.get();
  bench::BenchOptions options;
  options.hourly_usd = hourly_usd;
  options.show_progress = !flags.Has("quiet");
  LAMINA_ASSIGN_OR_RETURN(bench::BenchReport report, bench::RunBench(target, workload, options));
  std::printf("%s", bench::FormatReport(report).c_str());
  if (!cost_line.empty()) std::printf("priced as    %s\n", cost_line.c_str());
  if (flags.Has("json")) {
    const std::string path = flags.String("json", "");
    std::ofstream out(path);
    out << bench::ReportToJson(report).dump(2) << "\n";
    if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write the JSON report"));
  }
  return absl::OkStatus();
}

}  // namespace

int RunBenchCommand(const std::vector<std::string>& args) {
  absl::Status status = Bench(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina bench: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

}  // namespace lamina::cli
