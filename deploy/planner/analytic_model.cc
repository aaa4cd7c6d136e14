#include "deploy/planner/analytic_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/topology/kv_dtype.h"

namespace lamina::planner {

ModelShape ShapeOf(const ModelConfig& c, DType kv_dtype) {
  ModelShape m;
  m.layers = c.num_layers;
  m.hidden = c.hidden_size;
  m.tensor_parallel_sizes = {c.num_q_heads, c.num_kv_heads, c.intermediate_size,
                             c.tie_word_embeddings ? 1 : c.vocab_size};
  m.q_size = c.q_size();
  m.kv_size = c.kv_size();
  m.kv_token_bytes = static_cast<double>(KvBytesPerToken(kv_dtype, c));
  const double d = static_cast<double>(c.hidden_size);
  const double per_layer = d * (c.q_size() + 2.0 * c.kv_size())  // qkv projection
                           + c.q_size() * d                      // output projection
                           + 3.0 * d * c.intermediate_size       // gate, up, down
                           + 2.0 * d;                            // norms
  const double embedding = static_cast<double>(c.vocab_size) * d;
  const double lm_head = c.tie_word_embeddings ? 0 : embedding;
  m.params = c.num_layers * per_layer + embedding + lm_head + d;
  m.matmul_params = c.num_layers * (per_layer - 2.0 * d) + embedding;  // the LM head multiplies; the lookup does not
  return m;
}

double MinInterconnectBytesPerSecond(const ModelShape& model, double achieved_flops) {
  return model.wire_bytes_per_token() * achieved_flops / (2.0 * model.matmul_params);
}

std::string Design::Name() const {
  if (compute == nullptr) return "?";
  const std::string group =
      compute_devices > 1
          ? absl::StrCat(compute_devices, " x ", compute->name, tensor_parallel ? " (tensor parallel)" : " (layer split)")
          : absl::StrCat("1 x ", compute->name);
  if (memory == nullptr) return absl::StrCat(group, " (colocated)");
  return absl::StrCat(group, " + ", memory_devices, " x ", memory->name, pipelined ? " (pipelined)" : "");
}

namespace {

// A layer split's G devices as one: memory, rates and price added.
DeviceKind GroupOf(const DeviceKind& compute, int devices) {
  DeviceKind group = compute;
  group.memory_gb *= devices;
  group.memory_bandwidth_gbs *= devices;
  group.bf16_tflops *= devices;
  group.hourly_usd *= devices;
  return group;
}

}  // namespace

int ComputeDevicesFor(const ModelShape& model, const DeviceKind& compute, const Efficiency& eff, int most,
                      bool tensor_parallel) {
  for (int g = 1; g <= most; ++g) {
    if (model.weight_bytes() > g * compute.memory_gb * 1e9 * eff.memory_usable) continue;
    bool divides = true;
    for (int64_t size : model.tensor_parallel_sizes) divides &= !tensor_parallel || g == 1 || size % g == 0;
    if (divides) return g;
  }
  return 0;
}

Prediction PredictStep(const ModelShape& model, double context, const Design& design, const Efficiency& eff,
                       int64_t batch) {
  Prediction p;
  p.design = design;
  p.batch = batch;
  p.context = context;
  // A layer split over g devices keeps g batches in flight, each of batch / g rows: every stage
  // time each device runs its layers for one of them, so the group works like one device with
  // their rates added on batch / g rows, and a sequence waits g stage times (its batch's pass
  // through every device) for each token.
  const int devices = std::max(1, design.compute_devices);
  const bool split = devices > 1 && !design.tensor_parallel;
  const int g = split ? devices : 1;  // pipelined batches, each of batch / g rows
  const DeviceKind group = GroupOf(*design.compute, devices);
  const DeviceKind& c = group;
  const double b = static_cast<double>(batch) / g;
  const double weight_read_s = model.weight_bytes() / (c.memory_bandwidth_gbs * 1e9 * eff.memory_bandwidth);
  const double math_s = 2.0 * model.matmul_params * b / (c.bf16_tflops * 1e12 * eff.compute);
  p.compute_s = std::max(weight_read_s, math_s);
  if (devices > 1 && design.tensor_parallel) {
    // Two all-reduces of [batch, hidden] a layer, over a ring: 2 (G - 1) / G of the bytes each.
    const double bytes = b * model.hidden * model.bytes_per_value;
    const double ring = 2.0 * (devices - 1) / devices * bytes / (design.compute->link_gbs * 1e9 * eff.link);
    p.compute_s += model.layers * 2 * (ring + eff.layer_latency_us * 1e-6);
  }
  const double kv_bytes = b * context * model.kv_bytes_per_token();
  if (design.memory == nullptr) {
    p.attention_s = kv_bytes / (c.memory_bandwidth_gbs * 1e9 * eff.memory_bandwidth);
    p.step_s = p.compute_s + p.attention_s;
  } else {
    const DeviceKind& m = *design.memory;
    const int n = std::max(1, design.memory_devices);
    p.attention_s = kv_bytes / (n * m.memory_bandwidth_gbs * 1e9 * eff.memory_bandwidth);
    const double link_gbs = std::min(c.link_gbs, n * m.link_gbs) * eff.link;
    p.link_s = b * model.wire_bytes_per_token() / (link_gbs * 1e9) + model.layers * eff.layer_latency_us * 1e-6;
    p.step_s = design.pipelined ? std::max(p.compute_s, p.attention_s + p.link_s)
                                : p.compute_s + p.attention_s + p.link_s;
  }
  p.compute_s *= g;
  p.attention_s *= g;
  p.link_s *= g;
  p.step_s *= g;
  p.tokens_per_s = static_cast<double>(batch) / p.step_s;
  p.mfu = 2.0 * model.matmul_params * p.tokens_per_s / (c.bf16_tflops * 1e12);
  if (design.memory != nullptr) p.needed_link_gbs = p.tokens_per_s * model.wire_bytes_per_token() / 1e9;
  p.hourly_usd = c.hourly_usd + (design.memory ? design.memory_devices * design.memory->hourly_usd : 0);
  p.tokens_per_s_per_usd_hour = p.hourly_usd > 0 ? p.tokens_per_s / p.hourly_usd : 0;
  const double largest = std::max({p.compute_s, p.attention_s, p.link_s});
  if (largest == p.compute_s) {
    p.bottleneck = math_s >= weight_read_s ? "compute" : "weight reads";
  } else if (largest == p.attention_s) {
    p.bottleneck = "attention (KV reads)";
  } else {
    p.bottleneck = "link";
  }
  return p;
}

Prediction PredictBest(const ModelShape& model, double context, const Design& design, const Efficiency& eff,
                       int64_t max_batch, double tpot_target_s) {
  const int devices = std::max(1, design.compute_devices);
  const DeviceKind c = GroupOf(*design.compute, devices);
  const double compute_memory = c.memory_gb * 1e9 * eff.memory_usable;
  Prediction none;
  none.design = design;
  none.context = context;
  if (model.weight_bytes() > compute_memory) {
    none.infeasible = absl::StrFormat("the weights (%.1f GB) do not fit %s %s", model.weight_bytes() / 1e9,
                                      devices > 1 ? absl::StrCat(devices, " x") : "one", c.name);
    return none;
  }
  if (devices > 1 && !design.tensor_parallel && design.memory == nullptr) {
    none.infeasible = "a layer split keeps its KV caches on memory nodes";
    return none;
  }
  if (devices > 1 && design.tensor_parallel && design.memory != nullptr && design.pipelined) {
    none.infeasible = "a tensor-parallel group runs one batch (no pipelining over memory nodes)";
    return none;
  }
  const double kv_memory = design.memory == nullptr
                               ? compute_memory - model.weight_bytes()
                               : design.memory_devices * design.memory->memory_gb * 1e9 * eff.memory_usable;
  const int64_t fits = design.kv_capacity_tokens > 0
                           ? static_cast<int64_t>(design.kv_capacity_tokens / context)
                           : static_cast<int64_t>(kv_memory / (context * model.kv_bytes_per_token()));
  const int64_t cap = std::min(fits, max_batch);
  if (cap < 1) {
    none.infeasible = "not one sequence's KV fits";
    return none;
  }
  // Throughput B ÷ step(B) grows with B (step is affine in B), so the best batch is the largest allowed.
  int64_t lo = 1, hi = cap;
  if (tpot_target_s > 0) {
    if (PredictStep(model, context, design, eff, 1).step_s > tpot_target_s) {
      none.infeasible = "even batch 1 misses the time-per-token target";
      return none;
    }
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (PredictStep(model, context, design, eff, mid).step_s <= tpot_target_s) lo = mid; else hi = mid - 1;
    }
  } else {
    lo = cap;
  }
  Prediction p = PredictStep(model, context, design, eff, lo);
  if (lo == fits && fits <= max_batch) p.bottleneck = absl::StrCat("KV capacity (then ", p.bottleneck, ")");
  else if (lo < cap) p.bottleneck = absl::StrCat("latency target (then ", p.bottleneck, ")");
  return p;
}

int BestMemoryDevices(const ModelShape& model, double context, const DeviceKind& compute, const DeviceKind& memory,
                      double price_ratio, const Efficiency& eff, int64_t max_batch, double tpot_target_s,
                      bool pipelined, int max_devices, int compute_devices, bool tensor_parallel) {
  DeviceKind priced = memory;
  priced.hourly_usd = price_ratio * compute.hourly_usd;
  int best = 0;
  double best_value = 0;
  for (int n = 1; n <= max_devices; ++n) {
    Design design{&compute, &priced, n, pipelined};
    design.compute_devices = compute_devices;
    design.tensor_parallel = tensor_parallel;
    const Prediction p = PredictBest(model, context, design, eff, max_batch, tpot_target_s);
    if (p.infeasible.empty() && p.tokens_per_s_per_usd_hour > best_value * (1 + 1e-9)) {
      best_value = p.tokens_per_s_per_usd_hour;
      best = n;
    }
  }
  return best;
}

int BalancedMemoryDevices(const ModelShape& model, double context, const DeviceKind& compute, const DeviceKind& memory,
                          const Efficiency& eff, int64_t max_batch, double tpot_target_s, int max_devices,
                          int compute_devices) {
  for (int n = 1; n <= max_devices; ++n) {
    Design design{&compute, &memory, n, true};
    design.compute_devices = compute_devices;
    const Prediction p = PredictBest(model, context, design, eff, max_batch, tpot_target_s);
    if (p.infeasible.empty() && p.attention_s + p.link_s <= p.compute_s) return n;
  }
  return 0;
}

}  // namespace lamina::planner
