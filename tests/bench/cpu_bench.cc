// lamina-bench-cpu: the CPU engine's speed against baselines measured in the same run.
//   - FMA peak: independent fused multiply-adds in registers on every thread (the machine's
//     compute ceiling as this build can reach it); the matmul's GFLOP/s is reported against it.
//   - read bandwidth: a streaming sum over a buffer far larger than the caches; the matmul at
//     batch 1 (bound by reading weights) is reported against it.
//   - decode attention (one query per sequence over its cached k/v, slots scattered as a KV pool
//     leaves them): the k/v bytes it reads per second, reported against the read bandwidth and
//     against a plain gather of the same rows (summed, every thread a share, prefetched ahead): what
//     reading those scattered bytes costs with no attention in it; then the same attention over the
//     cache in bfloat16 (half the bytes), and how many times faster than over float32 it ran;
//     then over it in float8 e4m3 with a float scale per (slot, kv head), against float32 and
//     bfloat16.
//   - tokens/s of the bundled demo model at batch 1 and 16, decoding with the real engine.
// Usage: lamina-bench-cpu [--model DIR] [--seconds S]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/tensor/dtype.h"
#include "common/tensor/float8.h"
#include "common/threading/thread_pool.h"
#include "coordinator/embedded/local_cluster.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"

namespace lamina {
namespace {

using Clock = std::chrono::steady_clock;

typedef float V8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));

// 12 independent accumulators hide the FMA latency; returns a value so nothing is optimised away.
template <typename Vec>
inline __attribute__((always_inline)) float FmaLoop(int64_t iterations, float seed) {
  Vec acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = Vec{} + seed * (i + 1);
  const Vec a = Vec{} + 0.999999f, b = Vec{} + 1e-7f;
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = acc[i] * a + b;
  }
  float s = 0;
  for (int i = 0; i < 12; ++i) s += acc[i][0];
  return s;
}

// Eight floats a vector, as the kernels' AVX2 and baseline builds; sixteen, as their AVX-512 one.
__attribute__((target_clones("arch=x86-64-v3", "default"))) float FmaLoop8(int64_t iterations, float seed) {
  return FmaLoop<V8>(iterations, seed);
}
__attribute__((target("arch=x86-64-v4"))) float FmaLoop16(int64_t iterations, float seed) {
  return FmaLoop<V16>(iterations, seed);
}

// Sums four equal parts of [p, p + n) in lockstep, each into its own vector accumulator: bound by
// memory, not by an add chain, and with four streams in flight per thread as the matmul has (it
// reads four weight rows at once).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
float SumFloats(const float* p, int64_t n) {
  typedef float V8u __attribute__((vector_size(32), aligned(4)));
  const int64_t part = n / 4 / 8 * 8;
  V8 acc[4] = {};
  for (int64_t i = 0; i < part; i += 8) {
    for (int j = 0; j < 4; ++j) acc[j] += *reinterpret_cast<const V8u*>(p + j * part + i);
  }
  float s = 0;
  for (int j = 0; j < 4; ++j) {
    for (int l = 0; l < 8; ++l) s += acc[j][l];
  }
  for (int64_t i = 4 * part; i < n; ++i) s += p[i];
  return s;
}

// Sums the k and v rows rows[0..n) (`row_floats` each), prefetching 16 rows ahead.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) float SumRows(
    const float* k, const float* v, int64_t row_floats, const int32_t* rows, int64_t n) {
  typedef float V8u __attribute__((vector_size(32), aligned(4)));
  constexpr int64_t kAhead = 16;
  V8 acc[4] = {};
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) {
      for (int64_t d = 0; d < row_floats; d += 16) {
        __builtin_prefetch(k + rows[j + kAhead] * row_floats + d);
        __builtin_prefetch(v + rows[j + kAhead] * row_floats + d);
      }
    }
    const float* k_row = k + rows[j] * row_floats;
    const float* v_row = v + rows[j] * row_floats;
    int64_t d = 0;
    for (; d + 16 <= row_floats; d += 16) {
      acc[0] += *reinterpret_cast<const V8u*>(k_row + d);
      acc[1] += *reinterpret_cast<const V8u*>(k_row + d + 8);
      acc[2] += *reinterpret_cast<const V8u*>(v_row + d);
      acc[3] += *reinterpret_cast<const V8u*>(v_row + d + 8);
    }
    for (; d < row_floats; ++d) acc[0][0] += k_row[d] + v_row[d];
  }
  const V8 sum = acc[0] + acc[1] + acc[2] + acc[3];
  return sum[0] + sum[1] + sum[2] + sum[3] + sum[4] + sum[5] + sum[6] + sum[7];
}

// Runs fn repeatedly for about `seconds`; returns the best seconds per call.
double BestTime(double seconds, const std::function<void()>& fn) {
  fn();  // warm up
  double best = 1e30;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int runs = 0;
  while (Clock::now() < deadline || runs < 3) {
    auto start = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    ++runs;
  }
  return best;
}

// The FMA peak at the vector width of the kernels' best build on this CPU.
double PeakGflops(ThreadPool& pool, double seconds) {
  const int64_t iterations = 2'000'000;
  const bool wide = kernels::cpu::BestIsa() == kernels::cpu::Isa::kAvx512;
  volatile float sink = 0;
  double t = BestTime(seconds, [&] {
    pool.ParallelFor(pool.num_threads(), [&](int64_t i) {
      sink = sink + (wide ? FmaLoop16(iterations, 1.0f + i) : FmaLoop8(iterations, 1.0f + i));
    });
  });
  const double flops = 2.0 * (wide ? 16 : 8) * 12 * iterations * pool.num_threads();
  return flops / t / 1e9;
}

double ReadGbps(ThreadPool& pool, double seconds) {
  const int64_t n = int64_t{256} << 20;  // 1 GiB of floats: beyond any cache
  std::vector<float> data(n, 1.0f);
  std::vector<float> partial(pool.num_threads());
  double t = BestTime(seconds, [&] {
    const int64_t chunk = n / pool.num_threads();
    pool.ParallelFor(pool.num_threads(), [&](int64_t i) {
      partial[i] = SumFloats(data.data() + i * chunk, chunk);
    });
  });
  return n * sizeof(float) / t / 1e9;
}

struct MatmulResult {
  double gflops;
  double weight_gbps;
};

MatmulResult BenchMatmul(ThreadPool& pool, int64_t m, int64_t n, int64_t k, double seconds) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(m * k), w(n * k), y(m * n);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  double t = BestTime(seconds, [&] { kernels::cpu::Matmul(x.data(), w.data(), nullptr, y.data(), m, n, k, pool); });
  return {2.0 * m * n * k / t / 1e9, n * k * sizeof(float) / t / 1e9};
}

struct AttentionResult {
  double gbps;         // attention over a float32 cache: k/v bytes read per second
  double gather_gbps;  // the same rows summed
  double bf16_gbps;    // attention over the same cache in bfloat16: its k/v bytes read per second
  double bf16_speedup;  // the float32 call's time ÷ the bfloat16 call's
  double f8_gbps;       // attention over the same cache in float8: codes and scales read per second
  double f8_speedup;    // the float32 call's time ÷ the float8 call's
  double f8_over_bf16;  // the bfloat16 call's time ÷ the float8 call's
};

// Decode attention over `context` cached tokens per sequence, in slots shuffled across a pool of
// batch * context, a gather of the same rows, and the attention over the cache in bfloat16 and in
// float8.
AttentionResult BenchDecodeAttention(ThreadPool& pool, const kernels::cpu::AttentionShape& shape, int64_t batch,
                                     int64_t context, double seconds) {
  const int64_t slots = batch * context;
  const int64_t kv = shape.num_kv_heads * shape.head_dim, q_size = shape.num_q_heads * shape.head_dim;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> k(slots * kv), v(slots * kv), q(batch * q_size), out(batch * q_size);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  for (float& x : q) x = dist(rng);
  std::vector<int32_t> slot_ids(slots);
  for (int64_t i = 0; i < slots; ++i) slot_ids[i] = static_cast<int32_t>(i);
  std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
  std::vector<int64_t> begin(batch + 1);
  for (int64_t s = 0; s <= batch; ++s) begin[s] = s * context;
  const double bytes = 2.0 * slots * kv * sizeof(float);
  const double t = BestTime(seconds, [&] {
    kernels::cpu::DecodeAttention(shape, q.data(), q_size, k.data(), v.data(), kv, slot_ids.data(), begin.data(),
                                  out.data(), q_size, batch, pool);
  });
  std::vector<float> partial(pool.num_threads());
  const double gather_t = BestTime(seconds, [&] {
    const int64_t share = (slots + pool.num_threads() - 1) / pool.num_threads();
    pool.ParallelFor(pool.num_threads(), [&](int64_t i) {
      const int64_t first = std::min(slots, i * share);
      partial[i] = SumRows(k.data(), v.data(), kv, slot_ids.data() + first, std::min(slots, first + share) - first);
    });
  });
  std::vector<uint16_t> k_bits(k.size()), v_bits(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k_bits[i] = FloatToBFloat16(k[i]);
    v_bits[i] = FloatToBFloat16(v[i]);
  }
  const double bf16_t = BestTime(seconds, [&] {
    kernels::cpu::DecodeAttention(shape, q.data(), q_size, k_bits.data(), v_bits.data(), kv, slot_ids.data(),
                                  begin.data(), out.data(), q_size, batch, pool);
  });
  std::vector<uint8_t> k_codes(k.size()), v_codes(v.size());
  std::vector<float> k_scales(slots * shape.num_kv_heads), v_scales(slots * shape.num_kv_heads);
  QuantizeFloat8E4M3(k.data(), slots * shape.num_kv_heads, shape.head_dim, k_codes.data(), k_scales.data());
  QuantizeFloat8E4M3(v.data(), slots * shape.num_kv_heads, shape.head_dim, v_codes.data(), v_scales.data());
  const double f8_t = BestTime(seconds, [&] {
    kernels::cpu::DecodeAttention(shape, q.data(), q_size, k_codes.data(), v_codes.data(), kv, k_scales.data(),
                                  v_scales.data(), slot_ids.data(), begin.data(), out.data(), q_size, batch, pool);
  });
  const double f8_bytes = 2.0 * slots * (kv + shape.num_kv_heads * sizeof(float));
  return {bytes / t / 1e9, bytes / gather_t / 1e9, bytes / 2 / bf16_t / 1e9, t / bf16_t, f8_bytes / f8_t / 1e9,
          t / f8_t,        bf16_t / f8_t};
}

double DecodeTokensPerSecond(LocalCluster& cluster, int batch, int max_tokens) {
  std::vector<GenerationRequest> requests(batch);
  const std::vector<int32_t> prompt = cluster.tokenizer().EncodePrompt("In this paper, we");
  for (GenerationRequest& r : requests) {
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
  }
  int64_t tokens = 0;
  Clock::time_point first_token_done;
  absl::Status status = cluster.Generate(requests, [&](const TokenEvent&) {
    if (++tokens == batch) first_token_done = Clock::now();  // prefill and the first sample
  });
  if (!status.ok()) {
    std::fprintf(stderr, "generate failed: %s\n", std::string(status.message()).c_str());
    return 0;
  }
  const double decode_seconds = std::chrono::duration<double>(Clock::now() - first_token_done).count();
  return (tokens - batch) / decode_seconds;
}

int Main(int argc, char** argv) {
  std::string model = LAMINA_DEMO_MODEL_DIR;
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--model") == 0) model = argv[i + 1];
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
  }
  ThreadPool& pool = ThreadPool::Default();
  std::printf("lamina-bench-cpu: %d threads, kernels for %s; command: ", pool.num_threads(),
              kernels::cpu::IsaName(kernels::cpu::BestIsa()));
  for (int i = 0; i < argc; ++i) std::printf("%s ", argv[i]);
  std::printf("\n\n");

  const double peak = PeakGflops(pool, seconds);
  const double read = ReadGbps(pool, seconds);
  std::printf("baselines (same run): FMA peak %.1f GFLOP/s, streaming read %.1f GB/s\n\n", peak, read);

  std::printf("%-34s %10s %10s %12s %10s\n", "matmul y[m,n] = x[m,k] w[n,k]^T", "GFLOP/s", "of peak", "weights GB/s", "of read");
  struct Shape {
    const char* what;
    int64_t m, n, k;
  };
  const Shape shapes[] = {
      {"demo gate_up, batch 1", 1, 1376, 256},   {"demo gate_up, batch 16", 16, 1376, 256},
      {"demo gate_up, prefill 128", 128, 1376, 256}, {"4096x4096, batch 1", 1, 4096, 4096},
      {"4096x4096, batch 16", 16, 4096, 4096},   {"4096x4096, batch 128", 128, 4096, 4096},
      {"16384x16384 (1 GiB), batch 1", 1, 16384, 16384},
  };
  for (const Shape& s : shapes) {
    MatmulResult r = BenchMatmul(pool, s.m, s.n, s.k, seconds);
    std::printf("%-34s %10.1f %9.0f%% %12.1f %9.0f%%\n", s.what, r.gflops, 100 * r.gflops / peak, r.weight_gbps,
                100 * r.weight_gbps / read);
  }

  std::printf("\n%-34s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "decode attention, slots shuffled", "k/v GB/s",
              "of read", "gather GB/s", "of gather", "bf16 GB/s", "bf16 x", "f8 GB/s", "f8 x", "f8/bf16 x");
  struct AttentionCase {
    const char* what;
    kernels::cpu::AttentionShape shape;
    int64_t batch, context;
  };
  const AttentionCase attention_cases[] = {
      {"demo (8/4 heads, d 32), 1 x 256", {8, 4, 32}, 1, 256},
      {"demo, 16 x 256", {8, 4, 32}, 16, 256},
      {"demo, 64 x 1024", {8, 4, 32}, 64, 1024},
      {"llama-3-8b (32/8, d 128), 1 x 2048", {32, 8, 128}, 1, 2048},
      {"llama-3-8b, 16 x 2048", {32, 8, 128}, 16, 2048},
      {"llama-3-8b, 64 x 2048", {32, 8, 128}, 64, 2048},
  };
  for (const AttentionCase& c : attention_cases) {
    const AttentionResult r = BenchDecodeAttention(pool, c.shape, c.batch, c.context, seconds);
    std::printf("%-34s %10.1f %9.0f%% %11.1f %9.0f%% %10.1f %9.2fx %10.1f %9.2fx %9.2fx\n", c.what, r.gbps,
                100 * r.gbps / read, r.gather_gbps, 100 * r.gbps / r.gather_gbps, r.bf16_gbps, r.bf16_speedup,
                r.f8_gbps, r.f8_speedup, r.f8_over_bf16);
  }

  // The same kernels built for each instruction set this CPU has, against the best (isa.h).
  const kernels::cpu::Isa best_isa = kernels::cpu::BestIsa();
  if (best_isa != kernels::cpu::Isa::kBaseline) {
    std::printf("\n%-34s", "instruction sets: best ÷ each");
    const kernels::cpu::Isa isas[] = {kernels::cpu::Isa::kBaseline, kernels::cpu::Isa::kAvx2,
                                      kernels::cpu::Isa::kAvx512};
    for (kernels::cpu::Isa isa : isas) {
      if (isa <= best_isa) std::printf(" %10s", kernels::cpu::IsaName(isa));
    }
    std::printf("\n");
    struct Figure {
      const char* what;
      std::function<double()> measure;  // higher is faster
    };
    const Figure figures[] = {
        {"matmul 4096x4096, batch 16", [&] { return BenchMatmul(pool, 16, 4096, 4096, seconds).gflops; }},
        {"matmul 4096x4096, batch 128", [&] { return BenchMatmul(pool, 128, 4096, 4096, seconds).gflops; }},
        {"attention demo, 16 x 256",
         [&] {
           return BenchDecodeAttention(pool, {8, 4, 32}, 16, 256, seconds).gbps;
         }},
        {"attention llama-3-8b, 16 x 2048",
         [&] {
           return BenchDecodeAttention(pool, {32, 8, 128}, 16, 2048, seconds).gbps;
         }},
    };
    for (const Figure& f : figures) {
      std::vector<double> rates;
      for (kernels::cpu::Isa isa : isas) {
        if (isa > best_isa) continue;
        kernels::cpu::LimitIsa(isa);
        rates.push_back(f.measure());
      }
      kernels::cpu::LimitIsa(best_isa);
      std::printf("%-34s", f.what);
      for (double rate : rates) std::printf(" %9.2fx", rates.back() / rate);
      std::printf("\n");
    }
  }

  auto cluster = LocalCluster::Load(model);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  std::printf("\n%-34s %10s\n", "demo model decode (64 tokens each)", "tokens/s");
  for (int batch : {1, 16}) {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) best = std::max(best, DecodeTokensPerSecond(**cluster, batch, 64));
    std::printf("%-34s %10.0f\n", (std::string("batch ") + std::to_string(batch)).c_str(), best);
  }
  return 0;
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) { return lamina::Main(argc, argv); }
