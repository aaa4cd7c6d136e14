// lamina-bench-e2e: decode steps per second of a Llama-3-8B-shaped model with random bf16 weights,
// everything on one GPU (compute slices, KV pool, attention and sampling), at several batch sizes
// and one context length, against the roofline: (weight bytes + KV bytes per step) ÷ the best
// plain read rate measured in the same run. Each step runs eagerly and as one CUDA graph, the graph
// both with its kernels chained (kernels/cuda/chaining.h, the default) and without.
//
// A second table times the compute node's own decode path, where q/k/v and attention outputs pass
// through host memory every layer (as they do over a host data plane; here the memory side is an
// in-process AttentionExecutor on the same GPU): eager launches with logits brought to the host
// and sampled there (the node before CUDA graphs), eager with tokens drawn on the GPU, and CUDA
// graphs per slice with tokens drawn on the GPU (the node now). All three alternate step by step.
//   lamina-bench-e2e [--batches 1,32,128] [--context 2048] [--node-context 256 (0: no second table)]
//                    [--out results.csv]
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/graph.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "compute_node/engine/compute_engine.h"
#include "compute_node/engine/cuda/cuda_model_weights.h"
#include "compute_node/engine/cuda/cuda_slice_backend.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/chaining.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sampling.h"
#include "kv/attention/attention_executor.h"
#include "tests/bench/gpu_timing.h"

namespace lamina::bench {
namespace {

using bf16 = __nv_bfloat16;
namespace kc = kernels::cuda;

ModelConfig Llama3_8B() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM (random weights)";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope.type = RopeConfig::Type::kLlama3;
  c.rope.theta = 500000;
  c.rope.factor = 8;
  return c;
}

// gpt-fast on an H100 at context 2048 (PERFORMANCE.md): tokens/s by batch. Not measured in this run.
double GptFastH100(int batch) { return batch == 1 ? 133 : batch == 32 ? 960 : batch == 128 ? 1156 : 0; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The compute node's decode path at each batch size: milliseconds per step for the three ways of
// running it, alternating step by step over the same weights.
absl::Status NodeDecodePath(const CudaModelWeights& weights, const std::vector<int32_t>& batches, int64_t context) {
  const ModelConfig& c = weights.config;
  constexpr int kWarmSteps = 2, kTimedSteps = 12;
  std::printf("\nthe compute node's decode path (q/k/v and attention outputs through host memory each layer),\n"
              "context %lld, ms per step, medians of %d steps each, alternating\n",
              static_cast<long long>(context), kTimedSteps);
  std::printf("%6s %18s %18s %18s %14s\n", "batch", "eager+host sample", "eager+GPU sample", "graphs+GPU sample",
              "speed-up");
  for (int batch : batches) {
    const int64_t slots = 2 * batch * (context + kWarmSteps + 2 * kTimedSteps + 2);
    LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<AttentionExecutor> memory,
                            AttentionExecutor::Create({c.num_layers, slots, {c.num_q_heads, c.num_kv_heads, c.head_dim, 0}, 0}));
    std::unique_ptr<ComputeEngine> engines[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaSliceBackend> prefill, CudaSliceBackend::Create(&weights, 0));
      LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaSliceBackend> decode, CudaSliceBackend::Create(&weights, 0, graphs));
      engines[graphs] = std::make_unique<ComputeEngine>(std::move(prefill), std::move(decode), memory.get());
    }
    // Each engine decodes its own sequences: prompts of `context` tokens, prefilled 16 at a time.
    std::vector<int32_t> prompt(context);
    for (int64_t t = 0; t < context; ++t) prompt[t] = static_cast<int32_t>((t * 31 + 7) % c.vocab_size);
    std::vector<DecodeToken> steps[2];
    for (int e = 0; e < 2; ++e) {
      for (int first = 0; first < batch; first += 16) {
        std::vector<PrefillSequence> chunk;
        for (int b = first; b < std::min(batch, first + 16); ++b) chunk.push_back({e * batch + b, prompt});
        Tensor logits;
        LAMINA_RETURN_IF_ERROR(engines[e]->Prefill(chunk, false, &logits));
      }
      for (int b = 0; b < batch; ++b) steps[e].push_back({e * batch + b, 1, static_cast<int32_t>(context)});
    }
    std::vector<double> ms[3];
    std::vector<int32_t> tokens(batch);
    std::vector<TokenDraw> draws;
    Tensor logits;
    for (int step = 0; step < kWarmSteps + kTimedSteps; ++step) {
      for (int mode = 0; mode < 3; ++mode) {
        const int e = mode == 2 ? 1 : 0;
        draws.clear();
        for (int b = 0; b < batch; ++b) draws.push_back({b, {0.8f, 50, 0.95f, 1}, static_cast<uint64_t>(steps[e][b].position) + 1});
        const auto start = std::chrono::steady_clock::now();
        if (mode == 0) {
          LAMINA_RETURN_IF_ERROR(engines[e]->Decode(steps[e], &logits));
          for (int b = 0; b < batch; ++b) tokens[b] = SampleToken(logits.row(b), c.vocab_size, draws[b].params, draws[b].counter);
        } else {
          LAMINA_RETURN_IF_ERROR(engines[e]->Decode(steps[e], draws, tokens.data()));
        }
        const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
        if (step >= kWarmSteps) ms[mode].push_back(took.count());
        for (int b = 0; b < batch; ++b) steps[e][b] = {steps[e][b].seq, tokens[b], steps[e][b].position + 1};
      }
    }
    const double old_ms = Median(ms[0]), device_ms = Median(ms[1]), graph_ms = Median(ms[2]);
    std::printf("%6d %18.2f %18.2f %18.2f %13.2fx\n", batch, old_ms, device_ms, graph_ms, old_ms / graph_ms);
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"batches", "context", "node-context", "out"}, {}));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> batches, cli::ParseIdList("--batches", flags.String("batches", "1,32,128")));
  const int64_t context = std::stoll(flags.String("context", "2048"));
  const ModelConfig c = Llama3_8B();
  cudaDeviceProp prop;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream timing_stream, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(double read_rate, BestReadRate(timing_stream.get()));
  std::printf("%s: best plain read rate in this run %.2f TB/s\n", prop.name, read_rate / 1e12);
  const double parameters = static_cast<double>(c.num_layers) *
                                (c.hidden_size * (c.qkv_size() + c.q_size() + 3 * c.intermediate_size) +
                                 2 * c.hidden_size) +
                            2.0 * c.vocab_size * c.hidden_size;
  std::fprintf(stderr, "filling %.1f GB of random weights...\n", parameters * sizeof(bf16) / 1e9);
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaModelWeights> weights, CudaModelWeights::Random(c, 7));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaSliceBackend> slices, CudaSliceBackend::Create(weights.get(), 0));
  cudaStream_t stream = slices->stream();

  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t per_seq = context + 1;  // the cached context plus the new token
  const int64_t kv_size = c.kv_size();
  const int64_t layer_elems = max_batch * per_seq * kv_size;
  std::fprintf(stderr, "filling a KV pool of %.1f GB...\n", 2.0 * c.num_layers * layer_elems * sizeof(bf16) / 1e9);
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer pool,
                          cuda::DeviceBuffer::Create(2 * c.num_layers * layer_elems * sizeof(bf16)));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(pool.as<bf16>(), 2 * c.num_layers * layer_elems, 1.f, 9, stream));
  int sms = prop.multiProcessorCount;

  FILE* csv = nullptr;
  if (!flags.String("out", "").empty()) csv = std::fopen(flags.String("out", "").c_str(), "w");
  std::printf("\nLlama-3-8B shape, context %lld, one GPU, bf16 weights and KV\n", static_cast<long long>(context));
  std::printf("%6s %10s %16s %10s %10s %12s %12s %12s %16s\n", "batch", "eager ms", "graph unchained", "graph ms",
              "chained x", "tokens/s", "roofline ms", "of roofline", "vs gpt-fast H100");
  for (int batch : batches) {
    std::vector<int32_t> tokens(batch), positions(batch, static_cast<int32_t>(context));
    for (int b = 0; b < batch; ++b) tokens[b] = (b * 7919) % c.vocab_size;
    LAMINA_RETURN_IF_ERROR(slices->SetBatch(tokens, positions));
    std::vector<int32_t> ids(batch * per_seq), begin(batch + 1), write(batch);
    std::iota(ids.begin(), ids.end(), 0);
    for (int b = 0; b <= batch; ++b) begin[b] = static_cast<int32_t>(b * per_seq);
    for (int b = 0; b < batch; ++b) write[b] = static_cast<int32_t>(b * per_seq + context);
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_ids, cuda::DeviceBuffer::Create(ids.size() * sizeof(int32_t)));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_begin, cuda::DeviceBuffer::Create(begin.size() * sizeof(int32_t)));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_write, cuda::DeviceBuffer::Create(write.size() * sizeof(int32_t)));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_ids.data(), ids.data(), d_ids.bytes(), cudaMemcpyHostToDevice));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_begin.data(), begin.data(), d_begin.bytes(), cudaMemcpyHostToDevice));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_write.data(), write.data(), d_write.bytes(), cudaMemcpyHostToDevice));
    const kc::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, 0};
    const kc::DecodePlan plan = kc::PlanDecode(shape, batch, per_seq, sms);
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer work,
                            cuda::DeviceBuffer::Create(std::max<int64_t>(1, plan.workspace_floats) * sizeof(float)));
    std::vector<kc::DeviceSamplingParams> params(batch, {0.8f, 50, 0.95f, 1, static_cast<uint64_t>(context)});
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_params, cuda::DeviceBuffer::Create(params.size() * sizeof(params[0])));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_params.data(), params.data(), d_params.bytes(), cudaMemcpyHostToDevice));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_out, cuda::DeviceBuffer::Create(batch * sizeof(int32_t)));

    auto step = [&]() -> absl::Status {
      LAMINA_RETURN_IF_ERROR(slices->EmbedAndProject());
      for (int64_t l = 0; l < c.num_layers; ++l) {
        bf16* k = pool.as<bf16>() + (2 * l) * layer_elems;
        bf16* v = pool.as<bf16>() + (2 * l + 1) * layer_elems;
        const float* qkv = slices->device_qkv();
        LAMINA_RETURN_IF_ERROR(kc::StoreKv(qkv + c.q_size(), qkv + c.q_size() + kv_size, c.qkv_size(),
                                           d_write.as<int32_t>(), k, v, batch, kv_size, stream));
        LAMINA_RETURN_IF_ERROR(kc::DecodeAttention(shape, plan, qkv, c.qkv_size(), k, v, d_ids.as<int32_t>(),
                                                   d_begin.as<int32_t>(), slices->device_attn_out(), c.q_size(), batch,
                                                   work.as<float>(), stream));
        if (l + 1 < c.num_layers) LAMINA_RETURN_IF_ERROR(slices->Middle(l + 1));
      }
      LAMINA_RETURN_IF_ERROR(slices->LogitsForAllRows());
      return kc::Sample(slices->device_logits(), nullptr, d_params.as<kc::DeviceSamplingParams>(), d_out.as<int32_t>(), batch,
                        c.vocab_size, stream);
    };
    LAMINA_ASSIGN_OR_RETURN(double eager_ms, MedianMs(step, stream, 10));

    // The step as one graph, with the kernels chained (chaining.h) and without, timed alternately.
    double graph_ms = 0, unchained_ms = 0;
    for (int round = 0; round < 2; ++round) {
      for (bool chained : {false, true}) {
        kc::SetKernelChaining(chained);
        // One step a graph, the median of 20 launches.
        LAMINA_ASSIGN_OR_RETURN(double ms, GraphedMs(step, stream, /*calls=*/1, /*runs=*/20));
        double& best = chained ? graph_ms : unchained_ms;
        best = round == 0 ? ms : std::min(best, ms);
      }
    }
    kc::SetKernelChaining(true);

    const double kv_bytes = 2.0 * c.num_layers * batch * per_seq * kv_size * sizeof(bf16);
    const double bytes = static_cast<double>(weights->StepBytes()) + kv_bytes;
    const double roofline_ms = bytes / read_rate * 1e3;
    const double tokens_per_s = batch / (graph_ms * 1e-3);
    const double gpt_fast = GptFastH100(batch);
    std::printf("%6d %10.2f %16.2f %10.2f %9.2fx %12.0f %12.2f %12.2f %16s\n", batch, eager_ms, unchained_ms,
                graph_ms, unchained_ms / graph_ms, tokens_per_s, roofline_ms, roofline_ms / graph_ms,
                gpt_fast > 0 ? absl::StrCat(absl::SixDigits(tokens_per_s / gpt_fast), "x").c_str() : "n/a");
    if (csv) {
      std::fprintf(csv, "%d,%lld,%.3f,%.3f,%.3f,%.1f,%.3f,%.4f\n", batch, static_cast<long long>(context), eager_ms,
                   unchained_ms, graph_ms, tokens_per_s, roofline_ms, roofline_ms / graph_ms);
    }
  }
  if (csv) std::fclose(csv);
  pool = cuda::DeviceBuffer();  // room for the node path's KV pool
  const int64_t node_context = std::stoll(flags.String("node-context", "256"));
  if (node_context == 0) return absl::OkStatus();
  return NodeDecodePath(*weights, batches, node_context);
}

}  // namespace
}  // namespace lamina::bench

int main(int argc, char** argv) {
  return lamina::bench::BenchMain("lamina-bench-e2e", argc, argv, lamina::bench::Run);
}
