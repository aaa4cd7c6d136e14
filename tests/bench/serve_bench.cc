// lamina-bench-serve: decode and prefill served through a real cluster on one GPU (a coordinator and
// a compute node holding its own KV pool, separate processes started by `lamina up`) against the
// same engine alone in this process, on the same model, batches and contexts, in one run.
//   - engine alone: ComputeEngine over a local pool, each decode step one CUDA graph, tokens drawn
//     on the GPU; the median step of `--steps` steps at each batch size, every sequence at
//     `--context` tokens;
//   - served: that many concurrent requests of `--context` - 1 prompt tokens and `--steps` + 8
//     output tokens (greedy, ignore_eos) through the cluster's gRPC API. Decode tokens/s counts the
//     tokens streamed while every request of the batch decodes (from the last one's first token to
//     the first one's last); the time per output token is the median gap between a request's
//     tokens in that window;
//   - prefill: prompt tokens/s of the engine alone (prompts of `--context` tokens, 16 a call) and
//     served (time to the last first token), against 2 x parameters FLOP a token at the bf16
//     matrix rate measured in the same run (a cuBLASLt product of the model's gate/up shape);
//   - with `--torch SCRIPT`: a gpt-fast-style PyTorch baseline (tests/bench/gpt_fast_baseline.py)
//     at the same batches and context, run as a child process.
// Ratios: served / engine for decode tokens/s and for the time per output token (against the
// engine's step), and each against the baseline.
//   lamina-bench-serve [--model DIR] [--device cuda:0] [--batches 1,32,128] [--context 2048]
//                      [--steps 64] [--torch SCRIPT]
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "common/flags/flags.h"
#include "common/model_config/model_config.h"
#include "common/status/status_macros.h"
#include "compute_node/engine/device_engine.h"
#include "compute_node/local/local_pool.h"
#include "compute_node/local/placed_attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "tests/bench/gpu_timing.h"
#include "tests/integration/cluster_harness.h"

namespace lamina::bench {
namespace {

using Clock = std::chrono::steady_clock;
using bf16 = __nv_bfloat16;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Prompt `index` of `tokens` ids, each request's its own (no cached prefix is shared).
std::vector<int32_t> Prompt(int index, int64_t tokens, int64_t vocab) {
  std::vector<int32_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((index * 7919 + t * 31 + 7) % vocab);
  return ids;
}

struct EngineFigures {
  double step_ms = 0;           // median decode step
  double prefill_tokens_s = 0;  // prompt tokens per second
};

// The engine alone, in this process, over a local pool on `device`.
absl::StatusOr<std::map<int, EngineFigures>> EngineAlone(const DeviceSpec& device, const std::string& model_dir,
                                                         const std::vector<int32_t>& batches, int64_t context,
                                                         int steps) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> weights, DeviceWeights::Load(device, model_dir, 7));
  const ModelConfig& c = weights->config();
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t slots = static_cast<int64_t>(max_batch) * (context + steps + 8);
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<LocalPool> pool,
                          LocalPool::Create({c.num_layers, slots, {c.num_q_heads, c.num_kv_heads, c.head_dim, 0},
                                             device.index, DType::kBF16}));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<PlacedAttention> attention,
                          PlacedAttention::Create(pool.get(), "local", nullptr));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ComputeEngine> engine, weights->MakeEngine(attention.get()));
  std::map<int, EngineFigures> out;
  SequenceId next_seq = 0;
  for (int batch : batches) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<DecodeToken> step;
    std::vector<SequenceId> seqs;
    for (int b = 0; b < batch; ++b) prompts.push_back(Prompt(b, context, c.vocab_size));
    double prefill_seconds = 0;
    std::vector<int32_t> first(16);
    for (int begin = 0; begin < batch; begin += 16) {
      std::vector<PrefillSequence> chunk;
      std::vector<TokenDraw> draws;
      for (int b = begin; b < std::min(batch, begin + 16); ++b) {
        draws.push_back({static_cast<int64_t>(chunk.size()), SamplingParams{}, static_cast<uint64_t>(context)});
        chunk.push_back({next_seq, prompts[b]});
        seqs.push_back(next_seq++);
      }
      const auto start = Clock::now();
      LAMINA_RETURN_IF_ERROR(engine->Prefill(chunk, draws, first.data()));
      prefill_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      for (size_t i = 0; i < chunk.size(); ++i) step.push_back({chunk[i].seq, first[i], static_cast<int32_t>(context)});
    }
    std::vector<double> ms;
    std::vector<int32_t> tokens(batch);
    std::vector<TokenDraw> draws;
    for (int s = 0; s < steps + 4; ++s) {
      draws.clear();
      for (int b = 0; b < batch; ++b) draws.push_back({b, SamplingParams{}, static_cast<uint64_t>(step[b].position) + 1});
      const auto start = Clock::now();
      LAMINA_RETURN_IF_ERROR(engine->Decode(step, draws, tokens.data()));
      if (s >= 4) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      for (int b = 0; b < batch; ++b) step[b] = {step[b].seq, tokens[b], step[b].position + 1};
    }
    for (SequenceId seq : seqs) attention->Free(seq);
    out[batch] = {Median(ms), static_cast<double>(batch) * context / prefill_seconds};
  }
  return out;
}

struct ServedFigures {
  double decode_tokens_s = 0;
  double tpot_ms = 0;
  double prefill_tokens_s = 0;
  bool ok = false;
};

// `batch` concurrent requests through the cluster.
ServedFigures Served(cli::ClusterClient& client, int batch, int64_t context, int steps, int64_t vocab) {
  std::vector<std::vector<Clock::time_point>> arrivals(batch);
  std::vector<std::thread> threads;
  std::mutex mu;
  bool failed = false;
  const auto start = Clock::now();
  for (int b = 0; b < batch; ++b) {
    threads.emplace_back([&, b] {
      lamina::v1::GenerateRequest r;
      for (int32_t id : Prompt(1000 + b, context - 1, vocab)) r.mutable_token_ids()->add_ids(id);
      r.set_max_tokens(steps + 8);
      r.set_ignore_eos(true);
      absl::Status status = client.Generate(r, [&](const lamina::v1::GenerateResponse& response) {
        for (int i = 0; i < response.token_ids_size(); ++i) arrivals[b].push_back(Clock::now());
      });
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed) std::fprintf(stderr, "served request failed: %s\n", std::string(status.message()).c_str());
        failed = true;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ServedFigures f;
  if (failed) return f;
  Clock::time_point all_decoding = start, first_done = Clock::time_point::max();
  for (const auto& a : arrivals) {
    if (a.empty()) return f;
    all_decoding = std::max(all_decoding, a.front());
    first_done = std::min(first_done, a.back());
  }
  int64_t tokens = 0;
  std::vector<double> gaps;
  for (const auto& a : arrivals) {
    for (size_t i = 1; i < a.size(); ++i) {
      if (a[i] <= all_decoding || a[i] > first_done) continue;
      ++tokens;
      gaps.push_back(std::chrono::duration<double, std::milli>(a[i] - a[i - 1]).count());
    }
  }
  const double window = std::chrono::duration<double>(first_done - all_decoding).count();
  f.decode_tokens_s = window > 0 ? tokens / window : 0;
  f.tpot_ms = Median(gaps);
  f.prefill_tokens_s = batch * (context - 1) / std::chrono::duration<double>(all_decoding - start).count();
  f.ok = tokens > 0;
  return f;
}

// The bf16 matrix rate: a cuBLASLt product of the model's gate/up shape over 4096 rows.
absl::StatusOr<double> MatrixFlops(const ModelConfig& c) {
  const int64_t m = 4096, n = 2 * c.intermediate_size, k = c.hidden_size;
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer x, cuda::DeviceBuffer::Create(m * k * sizeof(bf16)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer w, cuda::DeviceBuffer::Create(n * k * sizeof(bf16)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer y, cuda::DeviceBuffer::Create(m * n * sizeof(float)));
  LAMINA_RETURN_IF_ERROR(kernels::cuda::FillUniform(x.as<bf16>(), m * k, 1.f, 1, stream.get()));
  LAMINA_RETURN_IF_ERROR(kernels::cuda::FillUniform(w.as<bf16>(), n * k, 0.02f, 2, stream.get()));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<kernels::cuda::Gemm> gemm, kernels::cuda::Gemm::Create());
  LAMINA_ASSIGN_OR_RETURN(const double ms, MedianMs([&] {
    return gemm->Run(x.as<bf16>(), w.as<bf16>(), nullptr, y.as<float>(), m, n, k, false, stream.get());
  }, stream.get(), 20));
  return 2.0 * m * n * k / (ms * 1e-3);
}

// ms per decode step of the PyTorch baseline at each batch, from lines "batch B ms_per_step X".
std::map<int, double> TorchBaseline(const std::string& script, const std::vector<int32_t>& batches, int64_t context) {
  std::map<int, double> out;
  std::string list;
  for (int b : batches) absl::StrAppend(&list, list.empty() ? "" : ",", b);
  const std::string command = absl::StrCat("python3 ", script, " --batches ", list, " --context ", context);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::fputs(line, stderr);
    std::vector<std::string> words = absl::StrSplit(std::string(line), ' ', absl::SkipWhitespace());
    int batch;
    double ms;
    if (words.size() >= 4 && words[0] == "batch" && words[2] == "ms_per_step" && absl::SimpleAtoi(words[1], &batch) &&
        absl::SimpleAtod(words[3], &ms)) {
      out[batch] = ms;
    }
  }
  ::pclose(pipe);
  return out;
}

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags,
                          cli::Flags::Parse(args, {"model", "device", "batches", "context", "steps", "torch"}, {}));
  const std::string model_dir = flags.String("model", LAMINA_SOURCE_DIR "/deploy/models/llama-3.1-8b-shape");
  LAMINA_ASSIGN_OR_RETURN(const DeviceSpec device, ParseDevice(flags.String("device", "cuda:0")));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> batches, cli::ParseIdList("--batches", flags.String("batches", "1,32,128")));
  int64_t context = 0;
  int steps = 0;
  if (!absl::SimpleAtoi(flags.String("context", "2048"), &context) || context < 2) {
    return absl::InvalidArgumentError("--context: expected an integer of at least 2");
  }
  if (!absl::SimpleAtoi(flags.String("steps", "64"), &steps) || steps < 4) {
    return absl::InvalidArgumentError("--steps: expected an integer of at least 4");
  }
  LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  std::printf("lamina-bench-serve: %s, context %lld, %d decode steps a batch\n", model_dir.c_str(),
              static_cast<long long>(context), steps);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
  LAMINA_ASSIGN_OR_RETURN(const double matrix_flops, MatrixFlops(config));
  const double parameters = static_cast<double>(config.num_layers) *
                                (config.hidden_size * (config.qkv_size() + config.q_size() + 3 * config.intermediate_size)) +
                            2.0 * config.vocab_size * config.hidden_size;
  std::printf("bf16 matrix rate in this run: %.0f TFLOP/s; %.2fB parameters\n", matrix_flops / 1e12, parameters / 1e9);

  std::fprintf(stderr, "engine alone...\n");
  LAMINA_ASSIGN_OR_RETURN(const auto engine, EngineAlone(device, model_dir, batches, context, steps));

  std::fprintf(stderr, "served: starting the cluster...\n");
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  testing::ClusterOptions options;
  options.model = model_dir;
  options.device = flags.String("device", "cuda:0");
  options.random_weights_seed = 7;
  options.memory_nodes = 0;
  options.compute_kv_capacity_tokens = static_cast<int64_t>(max_batch) * (context + steps + 16);
  options.max_batch = max_batch;
  options.max_tokens_per_iteration = 8192;
  options.prefix_caching = false;
  std::map<int, ServedFigures> served;
  {
    LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<testing::ClusterHarness> cluster, testing::ClusterHarness::Start(options));
    for (int batch : batches) {
      std::fprintf(stderr, "served: batch %d...\n", batch);
      served[batch] = Served(cluster->client(), batch, context, steps, config.vocab_size);
    }
  }
  std::map<int, double> torch;
  if (!flags.String("torch", "").empty()) {
    std::fprintf(stderr, "PyTorch baseline...\n");
    torch = TorchBaseline(flags.String("torch", ""), batches, context);
  }

  std::printf("\n%6s %12s %12s %9s %12s %12s %9s %12s %10s\n", "batch", "engine ms", "engine tok/s", "served",
              "served tok/s", "served tpot", "tpot/step", "torch ms", "vs torch");
  for (int batch : batches) {
    const EngineFigures& e = engine.at(batch);
    const ServedFigures& s = served[batch];
    const double engine_tps = batch / (e.step_ms * 1e-3);
    const auto t = torch.find(batch);
    std::printf("%6d %12.2f %12.0f %8.2fx %12.0f %10.2fms %8.2fx %12s %10s\n", batch, e.step_ms, engine_tps,
                s.ok ? s.decode_tokens_s / engine_tps : 0.0, s.decode_tokens_s, s.tpot_ms,
                s.ok ? s.tpot_ms / e.step_ms : 0.0, t == torch.end() ? "-" : absl::StrCat(t->second).c_str(),
                t == torch.end() ? "-" : absl::StrCat(absl::SixDigits(t->second / (s.tpot_ms > 0 ? s.tpot_ms : 1)), "x").c_str());
  }
  std::printf("\nprefill (prompts of %lld tokens): share of the matrix rate (tokens/s x 2 x parameters / FLOP/s)\n",
              static_cast<long long>(context));
  for (int batch : batches) {
    const double e = engine.at(batch).prefill_tokens_s, s = served[batch].prefill_tokens_s;
    std::printf("%6d prompts: engine %8.0f tokens/s (%.2f), served %8.0f tokens/s (%.2f)\n", batch, e,
                e * 2 * parameters / matrix_flops, s, s * 2 * parameters / matrix_flops);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace lamina::bench

int main(int argc, char** argv) { return lamina::bench::BenchMain("lamina-bench-serve", argc, argv, lamina::bench::Run); }
