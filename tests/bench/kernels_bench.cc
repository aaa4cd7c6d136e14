// lamina-bench-kernels: the GPU kernels against baselines measured in the same run.
//  - decode attention: KV bytes read per second against the best plain read rate of this GPU, for
//    a call alone and among calls in a CUDA graph, and against PyTorch's SDPA at the same shapes
//    (from `sdpa_baseline.py`'s CSV, run just before, which times SDPA both ways too); and the
//    linked launch a memory node runs over a device link (k/v store, attention, done flag) in a graph;
//  - decode attention over a float8 cache against the bf16 one at the same shapes, in the same run;
//  - decode attention at short contexts: a warp per (sequence, kv head) against a block each;
//  - each compute-slice GEMM of a Llama-3-8B-shaped model: our cuBLASLt path (bf16 in, fp32 out,
//    epilogue plans) against one plain cublasGemmEx call with the same types.
//   - causal prefill attention on the tensor cores against the float32 CUDA-core kernel;
//   lamina-bench-kernels [--sdpa sdpa.csv] [--out results.csv] [--only attention|float8|short|gemm|prefill]
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "tests/bench/gpu_timing.h"

namespace lamina::bench {
namespace {

using bf16 = __nv_bfloat16;
namespace kc = kernels::cuda;

struct Shape {
  int q_heads, kv_heads, batch, context;
};

// PyTorch SDPA's microseconds for a shape: a call alone, and one among calls in a CUDA graph (0
// where the CSV has no such column).
struct SdpaTimes {
  double alone_us = 0, graph_us = 0;
};

std::map<std::tuple<int, int, int, int>, SdpaTimes> LoadSdpa(const std::string& path) {
  std::map<std::tuple<int, int, int, int>, SdpaTimes> out;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() != 5 && f.size() != 6) continue;
    out[{std::stoi(f[0]), std::stoi(f[1]), std::stoi(f[2]), std::stoi(f[3])}] = {
        std::stod(f[4]), f.size() == 6 ? std::stod(f[5]) : 0.0};
  }
  return out;
}

// One decode batch on the GPU: each sequence's `context` tokens in contiguous slots, random bf16
// k/v, zero queries. The caches come in `copies` (at least 2) that calls take in turn, together at
// least twice the GPU's L2, so that no call finds its cache lines left there by the calls before:
// a decode step's call reads its layer's cache from memory.
struct DecodeInputs {
  static absl::StatusOr<DecodeInputs> Create(const Shape& s, cudaStream_t stream);

  kc::AttentionShape shape;
  int64_t batch = 0, slots = 0, kv_size = 0, q_size = 0, copies = 1;
  cuda::DeviceBuffer k, v, ids, begin, q, out;  // k, v: [copies][slots][kv_size]

  // Median milliseconds of one DecodeAttention call under `plan`: alone (host launch included), or
  // `graphed` among calls back to back in a CUDA graph (GraphedMs).
  absl::StatusOr<double> TimeMs(const kc::DecodePlan& plan, cudaStream_t stream, bool graphed = false) const;
  // The same for LinkedDecodeAttention among calls in a CUDA graph, as a memory node runs it over a
  // device link: each sequence's new k/v stored at its last slot, the done flag raised in device
  // memory; the inputs are in place (no ready flag to wait on).
  absl::StatusOr<double> LinkedGraphedMs(const kc::DecodePlan& plan, cudaStream_t stream) const;
  double kv_bytes() const { return 2.0 * slots * kv_size * sizeof(bf16); }  // one call's

  // The same cache as float8 codes and scales (Float8KvLayer), as many copies: every code 1.0 and
  // every scale 1/64 (a call's time does not depend on the values). Then the calls above take
  // `float8` to run over it.
  absl::Status AddFloat8(cudaStream_t stream);
  double float8_bytes() const { return 2.0 * slots * (kv_size + shape.num_kv_heads * sizeof(float)); }
  bool float8 = false;
  cuda::DeviceBuffer k8, v8, k_scales, v_scales;  // [copies][slots][kv_size] codes, [copies][slots][kv_heads]
  kc::Float8KvLayer Float8Copy(int64_t copy) const {
    const int64_t codes = copy * slots * kv_size, scales = copy * slots * shape.num_kv_heads;
    return {const_cast<uint8_t*>(k8.as<uint8_t>()) + codes, const_cast<uint8_t*>(v8.as<uint8_t>()) + codes,
            const_cast<float*>(k_scales.as<float>()) + scales, const_cast<float*>(v_scales.as<float>()) + scales};
  }
};

absl::Status DecodeInputs::AddFloat8(cudaStream_t stream) {
  const int64_t codes = copies * slots * kv_size, scales = copies * slots * shape.num_kv_heads;
  LAMINA_ASSIGN_OR_RETURN(k8, cuda::DeviceBuffer::Create(codes));
  LAMINA_ASSIGN_OR_RETURN(v8, cuda::DeviceBuffer::Create(codes));
  LAMINA_ASSIGN_OR_RETURN(k_scales, cuda::DeviceBuffer::Create(scales * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(v_scales, cuda::DeviceBuffer::Create(scales * sizeof(float)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(k8.data(), 0x38, codes, stream));  // e4m3 1.0
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v8.data(), 0x38, codes, stream));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(k_scales.data(), 0x3C, scales * sizeof(float), stream));  // ~1/87
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v_scales.data(), 0x3C, scales * sizeof(float), stream));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<DecodeInputs> DecodeInputs::Create(const Shape& s, cudaStream_t stream) {
  DecodeInputs in;
  const int64_t d = 128;
  in.shape = kc::AttentionShape{s.q_heads, s.kv_heads, d, 0};
  in.batch = s.batch;
  in.slots = static_cast<int64_t>(s.batch) * s.context;
  in.kv_size = s.kv_heads * d;
  in.q_size = s.q_heads * d;
  int l2_bytes = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  in.copies = std::max<int64_t>(2, static_cast<int64_t>(std::ceil(2.0 * l2_bytes / in.kv_bytes())));
  const int64_t elements = in.copies * in.slots * in.kv_size;
  LAMINA_ASSIGN_OR_RETURN(in.k, cuda::DeviceBuffer::Create(elements * sizeof(bf16)));
  LAMINA_ASSIGN_OR_RETURN(in.v, cuda::DeviceBuffer::Create(elements * sizeof(bf16)));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(in.k.as<bf16>(), elements, 1.f, 1, stream));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(in.v.as<bf16>(), elements, 1.f, 2, stream));
  std::vector<int32_t> ids(in.slots);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<int32_t> begin(s.batch + 1);
  for (int b = 0; b <= s.batch; ++b) begin[b] = b * s.context;
  LAMINA_ASSIGN_OR_RETURN(in.ids, cuda::DeviceBuffer::Create(in.slots * sizeof(int32_t)));
  LAMINA_ASSIGN_OR_RETURN(in.begin, cuda::DeviceBuffer::Create(begin.size() * sizeof(int32_t)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(in.ids.data(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(in.begin.data(), begin.data(), begin.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  LAMINA_ASSIGN_OR_RETURN(in.q, cuda::DeviceBuffer::Create(s.batch * in.q_size * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(in.out, cuda::DeviceBuffer::Create(s.batch * in.q_size * sizeof(float)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(in.q.data(), 0, in.q.bytes(), stream));
  return in;
}

absl::StatusOr<double> DecodeInputs::TimeMs(const kc::DecodePlan& plan, cudaStream_t stream, bool graphed) const {
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer work,
                          cuda::DeviceBuffer::Create(std::max<int64_t>(1, plan.workspace_floats) * sizeof(float)));
  int64_t turn = 0;
  auto call = [&] {
    const int64_t copy = turn++ % copies, at = copy * slots * kv_size;
    if (float8) {
      return kc::DecodeAttention(shape, plan, q.as<float>(), q_size, Float8Copy(copy), ids.as<int32_t>(),
                                 begin.as<int32_t>(), const_cast<float*>(out.as<float>()), q_size, batch,
                                 work.as<float>(), stream);
    }
    return kc::DecodeAttention(shape, plan, q.as<float>(), q_size, k.as<bf16>() + at, v.as<bf16>() + at,
                               ids.as<int32_t>(), begin.as<int32_t>(), const_cast<float*>(out.as<float>()), q_size,
                               batch, work.as<float>(), stream);
  };
  return graphed ? GraphedMs(call, stream) : MedianMs(call, stream);
}

absl::StatusOr<double> DecodeInputs::LinkedGraphedMs(const kc::DecodePlan& plan, cudaStream_t stream) const {
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer work,
                          cuda::DeviceBuffer::Create(std::max<int64_t>(1, plan.workspace_floats) * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer counters,
                          cuda::DeviceBuffer::CreateZeroed(kc::LinkedDecodeCounters(shape, batch) * sizeof(uint32_t)));
  // The new tokens' k and v rows (zeros), their slots (each context's last), the error word and
  // the done flag.
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer new_kv,
                          cuda::DeviceBuffer::CreateZeroed(2 * batch * kv_size * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer words, cuda::DeviceBuffer::CreateZeroed(2 * sizeof(uint64_t)));
  std::vector<int32_t> last(batch);
  for (int64_t b = 0; b < batch; ++b) last[b] = static_cast<int32_t>((b + 1) * (slots / batch) - 1);
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer write_slots, cuda::DeviceBuffer::Create(batch * sizeof(int32_t)));
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(write_slots.data(), last.data(), batch * sizeof(int32_t), cudaMemcpyHostToDevice));
  kc::DecodeLink link;
  link.k = new_kv.as<float>();
  link.v = new_kv.as<float>() + batch * kv_size;
  link.kv_stride = kv_size;
  link.write_slots = write_slots.as<int32_t>();
  link.done = words.as<uint64_t>();
  link.error = reinterpret_cast<uint32_t*>(words.as<uint64_t>() + 1);
  link.error_code = 1;
  link.counters = counters.as<uint32_t>();
  int64_t turn = 0;
  auto call = [&] {
    const int64_t copy = turn++ % copies, at = copy * slots * kv_size;
    link.done_value = static_cast<uint64_t>(turn);
    if (float8) {
      return kc::LinkedDecodeAttention(shape, plan, q.as<float>(), q_size, Float8Copy(copy), ids.as<int32_t>(),
                                       begin.as<int32_t>(), const_cast<float*>(out.as<float>()), q_size, batch,
                                       work.as<float>(), link, stream);
    }
    return kc::LinkedDecodeAttention(shape, plan, q.as<float>(), q_size, k.as<bf16>() + at, v.as<bf16>() + at,
                                     ids.as<int32_t>(), begin.as<int32_t>(), const_cast<float*>(out.as<float>()),
                                     q_size, batch, work.as<float>(), link, stream);
  };
  return GraphedMs(call, stream);
}

absl::Status BenchAttention(double read_rate, const std::string& sdpa_path, FILE* csv, cudaStream_t stream) {
  const auto sdpa = LoadSdpa(sdpa_path);
  int sms = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf(
      "\nDecode attention, head_dim 128, bf16 KV in token slots (contiguous runs per sequence): one call\n"
      "alone (host launch included), and among 20 in a CUDA graph (as decode steps run); share of the\n"
      "best read rate above, and PyTorch SDPA's time over ours, timed the same way\n");
  std::printf("%-7s %6s %8s %10s %12s %10s %12s %10s %10s %10s %12s\n", "heads", "batch", "context", "alone us",
              "of read rate", "graph us", "of read rate", "vs SDPA", "graphed", "linked us", "of read rate");
  const std::vector<Shape> shapes = {{32, 8, 1, 4096},  {32, 8, 4, 2048},   {32, 8, 8, 2048},  {32, 8, 16, 2048},
                                     {32, 8, 64, 2048}, {32, 8, 128, 4096}, {32, 32, 1, 4096}, {32, 32, 128, 4096}};
  auto ratio = [](double theirs_us, double ours_ms) {
    return theirs_us > 0 ? absl::StrCat(absl::SixDigits(theirs_us / (ours_ms * 1e3)), "x") : std::string("n/a");
  };
  for (const Shape& s : shapes) {
    LAMINA_ASSIGN_OR_RETURN(DecodeInputs in, DecodeInputs::Create(s, stream));
    const kc::DecodePlan plan = kc::PlanDecode(in.shape, s.batch, s.context, sms);
    LAMINA_ASSIGN_OR_RETURN(const double ms, in.TimeMs(plan, stream));
    LAMINA_ASSIGN_OR_RETURN(const double graph_ms, in.TimeMs(plan, stream, /*graphed=*/true));
    LAMINA_ASSIGN_OR_RETURN(const double linked_ms, in.LinkedGraphedMs(plan, stream));
    const double linked_share = in.kv_bytes() / (linked_ms * 1e-3) / read_rate;
    const double share = in.kv_bytes() / (ms * 1e-3) / read_rate;
    const double graph_share = in.kv_bytes() / (graph_ms * 1e-3) / read_rate;
    auto it = sdpa.find({s.q_heads, s.kv_heads, s.batch, s.context});
    const SdpaTimes theirs = it == sdpa.end() ? SdpaTimes{} : it->second;
    const char* kind = kc::DecodeStrategyName(plan.strategy);
    std::printf("%2d/%-4d %6d %8d %10.1f %12.2f %10.1f %12.2f %10s %10s %10.1f %12.2f   (%s, splits %d)\n", s.q_heads,
                s.kv_heads, s.batch, s.context, ms * 1e3, share, graph_ms * 1e3, graph_share,
                ratio(theirs.alone_us, ms).c_str(), ratio(theirs.graph_us, graph_ms).c_str(), linked_ms * 1e3,
                linked_share, kind, plan.splits);
    if (csv) {
      std::fprintf(csv, "attention,%d/%d,%d,%d,%.2f,%.4f,%.4f,%.4f,%.2f,%.4f,%.4f,%.2f,%.4f\n", s.q_heads, s.kv_heads,
                   s.batch, s.context, ms * 1e3, in.kv_bytes() / (ms * 1e-3) / 1e12, share,
                   theirs.alone_us > 0 ? theirs.alone_us / (ms * 1e3) : 0.0, graph_ms * 1e3, graph_share,
                   theirs.graph_us > 0 ? theirs.graph_us / (graph_ms * 1e3) : 0.0, linked_ms * 1e3, linked_share);
    }
  }
  return absl::OkStatus();
}

// Decode attention over a float8 cache (codes and a scale per token and kv head: 0.52 of bf16's
// bytes at these shapes) against the bf16 cache at the same shapes, both among calls in a CUDA
// graph, plain and linked, under the plans a memory node takes (Float8Plan of PlanDecode's).
absl::Status BenchFloat8(double read_rate, FILE* csv, cudaStream_t stream) {
  int sms = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf(
      "\nDecode attention over a float8 KV cache against bf16, head_dim 128, among 20 calls in a CUDA graph,\n"
      "plain and linked; bf16/f8 is bf16's time over float8's, and the share of the read rate counts\n"
      "float8's own bytes (codes and scales)\n");
  std::printf("%-7s %6s %8s %9s %9s %9s %12s %11s %11s %9s\n", "heads", "batch", "context", "bf16 us", "f8 us",
              "bf16/f8", "f8 of rate", "bf16 lnk us", "f8 lnk us", "bf16/f8");
  const std::vector<Shape> shapes = {{32, 8, 1, 4096},   {32, 8, 8, 2048},  {32, 8, 64, 2048},
                                     {32, 8, 128, 4096}, {32, 32, 1, 4096}, {32, 32, 128, 4096}};
  for (const Shape& s : shapes) {
    LAMINA_ASSIGN_OR_RETURN(DecodeInputs in, DecodeInputs::Create(s, stream));
    LAMINA_RETURN_IF_ERROR(in.AddFloat8(stream));
    const kc::DecodePlan plan = kc::PlanDecode(in.shape, s.batch, s.context, sms);
    const kc::DecodePlan float8_plan = kc::Float8Plan(plan);
    LAMINA_ASSIGN_OR_RETURN(const double bf16_ms, in.TimeMs(plan, stream, /*graphed=*/true));
    LAMINA_ASSIGN_OR_RETURN(const double bf16_linked_ms, in.LinkedGraphedMs(plan, stream));
    in.float8 = true;
    LAMINA_ASSIGN_OR_RETURN(const double f8_ms, in.TimeMs(float8_plan, stream, /*graphed=*/true));
    LAMINA_ASSIGN_OR_RETURN(const double f8_linked_ms, in.LinkedGraphedMs(float8_plan, stream));
    const double share = in.float8_bytes() / (f8_ms * 1e-3) / read_rate;
    std::printf("%2d/%-4d %6d %8d %9.1f %9.1f %9.2f %12.2f %11.1f %11.1f %9.2f\n", s.q_heads, s.kv_heads, s.batch,
                s.context, bf16_ms * 1e3, f8_ms * 1e3, bf16_ms / f8_ms, share, bf16_linked_ms * 1e3, f8_linked_ms * 1e3,
                bf16_linked_ms / f8_linked_ms);
    if (csv) {
      std::fprintf(csv, "float8,%d/%d,%d,%d,%.2f,%.2f,%.4f,%.2f,%.2f\n", s.q_heads, s.kv_heads, s.batch, s.context,
                   bf16_ms * 1e3, f8_ms * 1e3, share, bf16_linked_ms * 1e3, f8_linked_ms * 1e3);
    }
  }
  return absl::OkStatus();
}

// Large batches at short contexts, where each (sequence, kv head) has little to read: a warp each
// (kWarpPerHead) and a block each on the CUDA cores against a tiled block each (the baseline),
// all in one split. "picked" is what PlanDecode chooses.
absl::Status BenchShortContexts(FILE* csv, cudaStream_t stream) {
  int sms = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("\nDecode attention at short contexts, 32/8 heads of 128: a warp against a block per (sequence, kv "
              "head)\n");
  std::printf("%6s %8s %12s %11s %11s %12s %12s %8s\n", "batch", "context", "block us", "cores us", "warp us",
              "block/warp", "block/cores", "picked");
  for (int batch : {32, 64, 128, 256, 1024}) {
    for (int context : {1, 16, 64, 128, 256, 512, 1024}) {
      LAMINA_ASSIGN_OR_RETURN(DecodeInputs in, DecodeInputs::Create({32, 8, batch, context}, stream));
      kc::DecodePlan block_each = kc::PlanDecode(in.shape, batch, context, sms);
      if (block_each.splits > 1) continue;  // split plans keep a block per split
      // The tiled block each that the planner would pick without the warp layout (these batches
      // have more pairs than SMs, so shallow tiles).
      block_each.strategy = kc::DecodeStrategy::kTiled;
      kc::DecodePlan warp_each = block_each;
      warp_each.strategy = kc::DecodeStrategy::kWarpPerHead;
      kc::DecodePlan cores_each = block_each;  // a block each on the CUDA cores
      cores_each.strategy = kc::DecodeStrategy::kBlockPerHead;
      LAMINA_ASSIGN_OR_RETURN(double block_ms, in.TimeMs(block_each, stream));
      LAMINA_ASSIGN_OR_RETURN(double cores_ms, in.TimeMs(cores_each, stream));
      LAMINA_ASSIGN_OR_RETURN(double warp_ms, in.TimeMs(warp_each, stream));
      const kc::DecodePlan picked = kc::PlanDecode(in.shape, batch, context, sms);
      const char* picked_name = picked.strategy == kc::DecodeStrategy::kWarpPerHead ? "warp"
                                : picked.tiled()                                      ? "block"
                                                                                      : "cores";
      std::printf("%6d %8d %12.1f %11.1f %11.1f %12.2f %12.2f %8s\n", batch, context, block_ms * 1e3, cores_ms * 1e3,
                  warp_ms * 1e3, block_ms / warp_ms, block_ms / cores_ms, picked_name);
      if (csv) {
        std::fprintf(csv, "short_context,%d,%d,%.2f,%.2f,%.2f,%s\n", batch, context, block_ms * 1e3, cores_ms * 1e3,
                     warp_ms * 1e3, picked_name);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BenchGemms(double read_rate, FILE* csv, cudaStream_t stream) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<kc::Gemm> ours, kc::Gemm::Create());
  cublasHandle_t cublas = nullptr;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
  cublasSetStream(cublas, stream);
  struct Gemm {
    const char* name;
    int64_t n, k;
  };
  const std::vector<Gemm> gemms = {{"qkv", 6144, 4096}, {"o_proj", 4096, 4096}, {"gate_up", 28672, 4096},
                                   {"down", 4096, 14336}, {"lm_head", 128256, 4096}};
  std::printf("\nCompute-slice GEMMs, Llama-3-8B shapes, bf16 weights, fp32 accumulate and output\n");
  std::printf("%-8s %6s %11s %11s %13s %12s\n", "gemm", "M", "ours us", "cuBLAS us", "cuBLAS/ours", "weights TB/s");
  for (const Gemm& g : gemms) {
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer w, cuda::DeviceBuffer::Create(g.n * g.k * sizeof(bf16)));
    LAMINA_RETURN_IF_ERROR(kc::FillUniform(w.as<bf16>(), g.n * g.k, 0.02f, 3, stream));
    for (int64_t m : {1, 2, 4, 16, 128, 1024}) {
      LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer x, cuda::DeviceBuffer::Create(m * g.k * sizeof(bf16)));
      LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer y, cuda::DeviceBuffer::Create(m * g.n * sizeof(float)));
      LAMINA_RETURN_IF_ERROR(kc::FillUniform(x.as<bf16>(), m * g.k, 1.f, 4, stream));
      LAMINA_ASSIGN_OR_RETURN(double ours_ms, MedianMs(
                                                  [&] {
                                                    return ours->Run(x.as<bf16>(), w.as<bf16>(), nullptr, y.as<float>(),
                                                                     m, g.n, g.k, false, stream);
                                                  },
                                                  stream));
      const float alpha = 1.f, beta = 0.f;
      LAMINA_ASSIGN_OR_RETURN(
          double cublas_ms,
          MedianMs(
              [&]() -> absl::Status {
                const cublasStatus_t st =
                    cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, g.n, m, g.k, &alpha, w.data(), CUDA_R_16BF, g.k,
                                 x.data(), CUDA_R_16BF, g.k, &beta, y.data(), CUDA_R_32F, g.n, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT);
                if (st != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasGemmEx failed");
                return absl::OkStatus();
              },
              stream));
      const double weight_rate = g.n * g.k * sizeof(bf16) / (ours_ms * 1e-3);
      std::printf("%-8s %6lld %11.1f %11.1f %13.2f %12.2f\n", g.name, static_cast<long long>(m), ours_ms * 1e3,
                  cublas_ms * 1e3, cublas_ms / ours_ms, weight_rate / 1e12);
      if (csv) {
        std::fprintf(csv, "gemm,%s,%lld,%lld,%.2f,%.2f,%.4f,%.4f\n", g.name, static_cast<long long>(m),
                     static_cast<long long>(g.k), ours_ms * 1e3, cublas_ms * 1e3, cublas_ms / ours_ms,
                     weight_rate / read_rate);
      }
    }
  }
  cublasDestroy(cublas);
  return absl::OkStatus();
}

// Causal prefill attention of one prompt, 32 query heads and 8 kv heads of 128 (Llama-3-8B), on
// the tensor cores against the float32 CUDA-core kernel, in the same run; TFLOP/s counts the
// causal half of 4 x tokens^2 x head_dim per head.
absl::Status BenchPrefill(FILE* csv, cudaStream_t stream) {
  const kc::AttentionShape shape{32, 8, 128, 0};
  const int64_t q_size = 32 * 128, kv_size = 8 * 128, stride = q_size + 2 * kv_size;
  std::printf("\nPrefill attention of one prompt, 32/8 heads of 128: tensor cores against the CUDA cores\n");
  std::printf("%8s %14s %14s %10s %12s\n", "tokens", "CUDA cores ms", "tensor ms", "speed-up", "TFLOP/s");
  for (int64_t tokens : {512, 2048, 8192}) {
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer qkv, cuda::DeviceBuffer::Create(tokens * stride * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer out, cuda::DeviceBuffer::Create(tokens * q_size * sizeof(float)));
    LAMINA_RETURN_IF_ERROR(kc::FillUniform(qkv.as<float>(), tokens * stride, 1.f, 5, stream));
    const float* base = qkv.as<float>();
    double ms[2];
    for (int tensor = 0; tensor < 2; ++tensor) {
      LAMINA_ASSIGN_OR_RETURN(ms[tensor], MedianMs([&] {
        return tensor ? kc::PrefillAttention(shape, base, stride, base + q_size, base + q_size + kv_size, stride,
                                             out.as<float>(), q_size, tokens, stream)
                      : kc::PrefillAttentionOnCudaCores(shape, base, stride, base + q_size, base + q_size + kv_size,
                                                        stride, out.as<float>(), q_size, tokens, stream);
      }, stream, 10));
    }
    const double flops = 4.0 * tokens * tokens / 2 * 128 * 32;
    std::printf("%8lld %14.3f %14.3f %9.2fx %12.1f\n", static_cast<long long>(tokens), ms[0], ms[1], ms[0] / ms[1],
                flops / (ms[1] * 1e-3) / 1e12);
    if (csv) std::fprintf(csv, "prefill,%lld,%.4f,%.4f,%.3f\n", static_cast<long long>(tokens), ms[0], ms[1], ms[0] / ms[1]);
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"sdpa", "out", "only"}, {}));
  const std::string only = flags.String("only", "");
  if (!only.empty() && only != "attention" && only != "float8" && only != "short" && only != "gemm" &&
      only != "prefill") {
    return absl::InvalidArgumentError(
        absl::StrCat("--only ", only, ": expected attention, float8, short, gemm or prefill"));
  }
  auto runs = [&only](const char* part) { return only.empty() || only == part; };
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(double read_rate, ReportReadRate(stream.get()));
  FILE* csv = nullptr;
  const std::string out = flags.String("out", "");
  if (!out.empty()) {
    csv = std::fopen(out.c_str(), "w");
    if (!csv) return absl::InvalidArgumentError(absl::StrCat("--out ", out, ": cannot write"));
  }
  absl::Status status;
  if (runs("attention")) status = BenchAttention(read_rate, flags.String("sdpa", ""), csv, stream.get());
  if (status.ok() && runs("float8")) status = BenchFloat8(read_rate, csv, stream.get());
  if (status.ok() && runs("short")) status = BenchShortContexts(csv, stream.get());
  if (status.ok() && runs("gemm")) status = BenchGemms(read_rate, csv, stream.get());
  if (status.ok() && runs("prefill")) status = BenchPrefill(csv, stream.get());
  if (csv) std::fclose(csv);
  return status;
}

}  // namespace
}  // namespace lamina::bench

int main(int argc, char** argv) {
  return lamina::bench::BenchMain("lamina-bench-kernels", argc, argv, lamina::bench::Run);
}
