// lamina-bench-step-kernels: the kernels of a decode step other than the GEMMs, at the batch sizes
// where they are a step's fixed cost, against baselines measured in the same run:
//  - token sampling (temperature 0.8 with top-k 50, top-p 0.95, both, min-p 0.05, or min-p with
//    top-p) against greedy, over rows of 128,256 logits, flat (normal, sd 2.5: a nucleus of
//    thousands of tokens) or peaked (the same with 20 tokens lifted 3 to 9 above the rest, as a
//    confident model's), and against reading the logits once at the best plain read rate;
//  - log probabilities with 0, 5 or 20 alternatives against greedy sampling of the same rows;
//  - repetition, presence and frequency penalties over histories of 2048 tokens: the host's edits
//    (compute_node/sampling/penalties.h) and the device's upload, edit and restore, against
//    greedy sampling of the same rows;
//  - the elementwise kernels and decode attention of one layer (Llama-3-8B shapes, context 2048)
//    against an empty kernel timed the same way (the launch floor).
//   lamina-bench-step-kernels [--batches 1,8,32,128]
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "compute_node/sampling/penalties.h"
#include "compute_node/sampling/sampler.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/logprobs.h"
#include "kernels/cuda/penalties.h"
#include "kernels/cuda/sampling.h"
#include "tests/bench/gpu_timing.h"

namespace lamina::bench {
namespace {

using bf16 = __nv_bfloat16;
namespace kc = kernels::cuda;

constexpr int64_t kVocab = 128256, kHidden = 4096, kIntermediate = 14336;
constexpr int64_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kContext = 2048;
constexpr int64_t kQSize = kQHeads * kHeadDim, kKvSize = kKvHeads * kHeadDim, kQkvSize = kQSize + 2 * kKvSize;

__global__ void EmptyKernel() {}

template <typename T>
absl::StatusOr<cuda::DeviceBuffer> Upload(const std::vector<T>& host) {
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d,
                          cuda::DeviceBuffer::Create(std::max<size_t>(1, host.size()) * sizeof(T)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

absl::Status BenchSampling(const std::vector<int32_t>& batches, double read_rate, cudaStream_t stream) {
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::vector<float> flat(static_cast<size_t>(max_batch) * kVocab);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 2.5f);
  for (float& l : flat) l = normal(rng);
  std::vector<float> peaked = flat;
  for (int b = 0; b < max_batch; ++b) {
    for (int i = 0; i < 20; ++i) peaked[b * kVocab + (i * 7919 + b) % kVocab] = 14.f + 0.3f * i;
  }
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_tokens, cuda::DeviceBuffer::Create(max_batch * sizeof(int32_t)));
  struct Mode {
    const char* name;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p = 0.f;
  };
  const Mode modes[] = {{"greedy", 0.f, 0, 1.f},           {"top-k 50", 0.8f, 50, 1.f},
                        {"top-p .95", 0.8f, 0, 0.95f},     {"k 50, p .95", 0.8f, 50, 0.95f},
                        {"min-p .05", 0.8f, 0, 1.f, .05f}, {"min-p .05, p .95", 0.8f, 0, 0.95f, .05f}};
  std::printf("\nToken sampling over %lld logits a row, us per call (and x greedy)\n", static_cast<long long>(kVocab));
  std::printf("%7s %6s %11s", "logits", "batch", "read floor");
  for (const Mode& m : modes) std::printf(" %20s", m.name);
  std::printf("\n");
  for (const bool is_peaked : {false, true}) {
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_logits, Upload(is_peaked ? peaked : flat));
    for (int batch : batches) {
      std::printf("%7s %6d %11.1f", is_peaked ? "peaked" : "flat", batch,
                  batch * kVocab * sizeof(float) / read_rate * 1e6);
      double greedy_ms = 0;
      for (const Mode& m : modes) {
        std::vector<kc::DeviceSamplingParams> params(batch);
        SamplingParams sp{m.temperature, m.top_k, m.top_p, 7};
        sp.min_p = m.min_p;
        for (int b = 0; b < batch; ++b) {
          params[b] = {m.temperature, m.top_k, m.top_p, 7, static_cast<uint64_t>(b), MinPLogitOffset(sp)};
        }
        LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_params, Upload(params));
        LAMINA_ASSIGN_OR_RETURN(double ms, MedianMs(
                                               [&] {
                                                 return kc::Sample(d_logits.as<float>(), nullptr,
                                                                   d_params.as<kc::DeviceSamplingParams>(),
                                                                   d_tokens.as<int32_t>(), batch, kVocab, stream);
                                               },
                                               stream, 20));
        if (m.temperature == 0.f) greedy_ms = ms;
        std::printf(" %11.1f (%5.1fx)", ms * 1e3, ms / greedy_ms);
      }
      std::printf("\n");
    }
  }
  return absl::OkStatus();
}

// Greedy sampling of the first `batch` rows of `logits` [rows, kVocab]: the baseline of the
// blocks below, ms per call.
absl::StatusOr<double> GreedyMs(const cuda::DeviceBuffer& logits, int batch, cudaStream_t stream) {
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer params,
                          Upload(std::vector<kc::DeviceSamplingParams>(batch, {0.f, 0, 1.f, 7, 0})));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer tokens, cuda::DeviceBuffer::Create(batch * sizeof(int32_t)));
  return MedianMs(
      [&] {
        return kc::Sample(logits.as<float>(), nullptr, params.as<kc::DeviceSamplingParams>(), tokens.as<int32_t>(),
                          batch, kVocab, stream);
      },
      stream, 20);
}

// Log probabilities asked for with the tokens (kernels/cuda/logprobs.h) against greedy sampling
// of the same rows, both timed here: the cost a request adds by asking.
absl::Status BenchLogprobs(const std::vector<int32_t>& batches, double read_rate, cudaStream_t stream) {
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::vector<float> logits(static_cast<size_t>(max_batch) * kVocab);
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.f, 2.5f);
  for (float& l : logits) l = normal(rng);
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_logits, Upload(logits));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_tokens, Upload(std::vector<int32_t>(max_batch, 5)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_out,
                          cuda::DeviceBuffer::Create(max_batch * sizeof(kc::DeviceTokenLogprobs)));
  const int32_t tops[] = {0, 5, 20};
  std::printf("\nLog probabilities over %lld logits a row, us per call (and x greedy sampling)\n",
              static_cast<long long>(kVocab));
  std::printf("%6s %11s %10s", "batch", "read floor", "greedy");
  for (int32_t top : tops) std::printf("        top %2d", top);
  std::printf("\n");
  for (int batch : batches) {
    LAMINA_ASSIGN_OR_RETURN(double greedy_ms, GreedyMs(d_logits, batch, stream));
    std::printf("%6d %11.1f %10.1f", batch, batch * kVocab * sizeof(float) / read_rate * 1e6, greedy_ms * 1e3);
    for (int32_t top : tops) {
      LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_tops, Upload(std::vector<int32_t>(batch, top)));
      LAMINA_ASSIGN_OR_RETURN(double ms, MedianMs(
                                             [&] {
                                               return kc::Logprobs(d_logits.as<float>(), nullptr,
                                                                   d_tokens.as<int32_t>(), d_tops.as<int32_t>(),
                                                                   d_out.as<kc::DeviceTokenLogprobs>(), batch, kVocab,
                                                                   stream);
                                             },
                                             stream, 20));
      std::printf(" %6.1f (%4.1fx)", ms * 1e3, ms / greedy_ms);
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

// Penalties as CudaSliceBackend applies them: a row's edits built on the host from its history,
// uploaded, applied before the draw and undone after it, against greedy sampling of the same rows.
// Each row's history: a 1024-token prompt and 1024 generated tokens, drawn from a skewed
// distribution over the first 32,000 ids (a text's repeats), about 1,300 distinct tokens.
absl::Status BenchPenalties(const std::vector<int32_t>& batches, cudaStream_t stream) {
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::vector<float> logits(static_cast<size_t>(max_batch) * kVocab);
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.f, 2.5f);
  for (float& l : logits) l = normal(rng);
  std::vector<TokenHistory> histories;
  for (int b = 0; b < max_batch; ++b) {
    histories.emplace_back(1024);
    for (int32_t p = 0; p < 2048; ++p) {
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      histories.back().Add(p, static_cast<int32_t>(32000 * u * u * u));
    }
  }
  SamplingParams params;
  params.repetition_penalty = 1.1f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.2f;
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_logits, Upload(logits));
  std::printf(
      "\nPenalties over histories of 2048 tokens (%zu distinct in the first), us per step (and x greedy "
      "sampling)\n",
      histories[0].entries().size());
  std::printf("%6s %10s %9s %16s %16s\n", "batch", "greedy", "edits", "host edits", "device");
  for (int batch : batches) {
    LAMINA_ASSIGN_OR_RETURN(double greedy_ms, GreedyMs(d_logits, batch, stream));
    // As CudaSliceBackend::QueuePenalties: each row's edits written into pinned memory.
    int64_t most = 0;
    for (int b = 0; b < batch; ++b) most += static_cast<int64_t>(histories[b].entries().size());
    LAMINA_ASSIGN_OR_RETURN(cuda::PinnedBuffer h_edits,
                            cuda::PinnedBuffer::Create(most * sizeof(kc::DevicePenaltyEdit)));
    int64_t count = 0;
    auto build = [&] {
      auto* out = h_edits.as<kc::DevicePenaltyEdit>();
      count = 0;
      for (int b = 0; b < batch; ++b) {
        ForEachPenaltyEdit(params, histories[b], [&](const PenaltyEdit& e) {
          out[count++] = {b, e.token, e.divisor, e.subtract};
        });
      }
    };
    std::vector<double> host_us;
    for (int run = 0; run < 21; ++run) {
      const auto start = std::chrono::steady_clock::now();
      build();
      host_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(host_us.begin(), host_us.end());
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_edits,
                            cuda::DeviceBuffer::Create(count * sizeof(kc::DevicePenaltyEdit)));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_saved, cuda::DeviceBuffer::Create(count * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(
        double device_ms,
        MedianMs(
            [&]() -> absl::Status {
              LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_edits.data(), h_edits.data(),
                                                          count * sizeof(kc::DevicePenaltyEdit), cudaMemcpyHostToDevice,
                                                          stream));
              LAMINA_RETURN_IF_ERROR(kc::ApplyPenalties(d_logits.as<float>(), d_edits.as<kc::DevicePenaltyEdit>(),
                                                        d_saved.as<float>(), count, kVocab, stream));
              return kc::RestoreLogits(d_logits.as<float>(), d_edits.as<kc::DevicePenaltyEdit>(), d_saved.as<float>(),
                                       count, kVocab, stream);
            },
            stream, 20));
    std::printf("%6d %10.1f %9lld %8.1f (%4.1fx) %8.1f (%4.1fx)\n", batch, greedy_ms * 1e3,
                static_cast<long long>(count), host_us[host_us.size() / 2],
                host_us[host_us.size() / 2] / (greedy_ms * 1e3), device_ms * 1e3, device_ms / greedy_ms);
  }
  return absl::OkStatus();
}

absl::Status BenchLayerKernels(const std::vector<int32_t>& batches, cudaStream_t stream) {
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  int sms = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer residual, cuda::DeviceBuffer::Create(max_batch * kHidden * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer normed, cuda::DeviceBuffer::Create(max_batch * kQSize * sizeof(bf16)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer norm_weight, cuda::DeviceBuffer::Create(kHidden * sizeof(bf16)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer qkv, cuda::DeviceBuffer::Create(max_batch * kQkvSize * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer attn_out, cuda::DeviceBuffer::Create(max_batch * kQSize * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer gate_up,
                          cuda::DeviceBuffer::Create(max_batch * 2 * kIntermediate * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer activated,
                          cuda::DeviceBuffer::Create(max_batch * kIntermediate * sizeof(bf16)));
  const int64_t slots = max_batch * (kContext + 1);
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer k_cache, cuda::DeviceBuffer::Create(slots * kKvSize * sizeof(bf16)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer v_cache, cuda::DeviceBuffer::Create(slots * kKvSize * sizeof(bf16)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(residual.data(), 0, residual.bytes(), stream));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(qkv.data(), 0, qkv.bytes(), stream));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(gate_up.data(), 0, gate_up.bytes(), stream));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(norm_weight.as<bf16>(), kHidden, 1.f, 3, stream));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(k_cache.as<bf16>(), slots * kKvSize, 1.f, 4, stream));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(v_cache.as<bf16>(), slots * kKvSize, 1.f, 5, stream));
  std::vector<float> cos_sin = kc::RopeCosSin(std::vector<double>(kHeadDim / 2, 1e-3), kContext + 1);
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_cos_sin, Upload(cos_sin));

  const char* names[] = {"empty", "rms_norm", "rope", "store_kv", "attention", "to_bf16", "swiglu"};
  std::printf("\nOne layer's kernels besides the GEMMs, Llama-3-8B shapes, context %lld, us per call"
              " (and over an empty kernel's)\n", static_cast<long long>(kContext));
  std::printf("%6s", "batch");
  for (const char* n : names) std::printf(" %17s", n);
  std::printf("\n");
  for (int batch : batches) {
    std::vector<int32_t> positions(batch, kContext), ids(batch * (kContext + 1)), begin(batch + 1), write(batch);
    std::iota(ids.begin(), ids.end(), 0);
    for (int b = 0; b <= batch; ++b) begin[b] = static_cast<int32_t>(b * (kContext + 1));
    for (int b = 0; b < batch; ++b) write[b] = static_cast<int32_t>(b * (kContext + 1) + kContext);
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_positions, Upload(positions));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_ids, Upload(ids));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_begin, Upload(begin));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer d_write, Upload(write));
    const kc::AttentionShape shape{kQHeads, kKvHeads, kHeadDim, 0};
    const kc::DecodePlan plan = kc::PlanDecode(shape, batch, kContext + 1, sms);
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer work,
                            cuda::DeviceBuffer::Create(std::max<int64_t>(1, plan.workspace_floats) * sizeof(float)));
    const std::function<absl::Status()> kernels[] = {
        [&]() -> absl::Status {
          EmptyKernel<<<1, 32, 0, stream>>>();
          LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
          return absl::OkStatus();
        },
        [&] {
          return kc::RmsNorm(residual.as<float>(), nullptr, norm_weight.as<bf16>(), normed.as<bf16>(), batch, kHidden,
                             1e-5f, stream);
        },
        [&] {
          return kc::Rope(qkv.as<float>(), d_positions.as<int32_t>(), d_cos_sin.as<float>(), batch,
                          kQHeads + kKvHeads, kHeadDim, kQkvSize, stream);
        },
        [&] {
          const float* k = qkv.as<float>() + kQSize;
          return kc::StoreKv(k, k + kKvSize, kQkvSize, d_write.as<int32_t>(), k_cache.as<bf16>(), v_cache.as<bf16>(),
                             batch, kKvSize, stream);
        },
        [&] {
          return kc::DecodeAttention(shape, plan, qkv.as<float>(), kQkvSize, k_cache.as<bf16>(), v_cache.as<bf16>(),
                                     d_ids.as<int32_t>(), d_begin.as<int32_t>(), attn_out.as<float>(), kQSize, batch,
                                     work.as<float>(), stream);
        },
        [&] { return kc::ToBf16(attn_out.as<float>(), normed.as<bf16>(), batch * kQSize, stream); },
        [&] { return kc::SwiGlu(gate_up.as<float>(), activated.as<bf16>(), batch, kIntermediate, stream); },
    };
    std::printf("%6d", batch);
    double empty_ms = 0;
    for (const auto& kernel : kernels) {
      LAMINA_ASSIGN_OR_RETURN(double ms, MedianMs(kernel, stream, 50));
      if (empty_ms == 0) empty_ms = ms;
      std::printf(" %9.1f (%5.1fx)", ms * 1e3, ms / empty_ms);
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"batches"}, {}));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> batches,
                          cli::ParseIdList("--batches", flags.String("batches", "1,8,32,128")));
  if (batches.empty()) return absl::InvalidArgumentError("--batches: give at least one batch size");
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(double read_rate, ReportReadRate(stream.get()));
  LAMINA_RETURN_IF_ERROR(BenchSampling(batches, read_rate, stream.get()));
  LAMINA_RETURN_IF_ERROR(BenchLogprobs(batches, read_rate, stream.get()));
  LAMINA_RETURN_IF_ERROR(BenchPenalties(batches, stream.get()));
  return BenchLayerKernels(batches, stream.get());
}

}  // namespace
}  // namespace lamina::bench

int main(int argc, char** argv) {
  return lamina::bench::BenchMain("lamina-bench-step-kernels", argc, argv, lamina::bench::Run);
}
