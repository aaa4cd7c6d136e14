// The paper's analytic model of decode throughput and its cost (its sections 3 and 4), for
// `lamina plan` and for checking experiments. A decode step of batch B at mean context c costs:
//   compute    max(weight bytes ÷ memory rate, 2·N·B ÷ compute rate)   on the compute device
//   attention  B·c·(KV bytes per token) ÷ (memory rate of the devices holding the KV)
//   link       B·(q, k, v out and o back per token) ÷ link rate, plus a latency per layer
// where N is the parameter count touched per token. Colocated, attention runs on the compute device
// and there is no link; offloaded without pipelining the three add up; with staggered pipelining
// the step is max(compute, attention + link). The batch is the largest that fits the KV memory,
// the batch cap and the time-per-token target; throughput is B ÷ step, and per dollar it is
// divided by the devices' hourly price. Rates are the price table's, times the efficiencies.
// Pure functions; thread-safe.
#ifndef LAMINA_DEPLOY_PLANNER_ANALYTIC_MODEL_H_
#define LAMINA_DEPLOY_PLANNER_ANALYTIC_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/model_config/model_config.h"
#include "common/tensor/dtype.h"
#include "deploy/cost/price_table.h"

namespace lamina::planner {

struct ModelShape {
  double params = 0;          // every weight, embedding and LM head included
  double matmul_params = 0;   // N: weights multiplied per token (the embedding lookup is not)
  int64_t layers = 0;
  int64_t hidden = 0;         // the residual stream's width (what a tensor-parallel all-reduce sums)
  // What a tensor-parallel group's size must divide (CheckTensorParallel): heads, KV heads, the
  // MLP's width, and the vocabulary of an untied head (1 when tied).
  std::vector<int64_t> tensor_parallel_sizes;
  int64_t q_size = 0;         // values of q (and of o) per token per layer
  int64_t kv_size = 0;        // values of k (and of v) per token per layer
  double bytes_per_value = 2;  // e: bf16, for weights and what crosses the link
  double kv_token_bytes = 0;   // one token's k and v over every layer in the KV pool's dtype (KvBytesPerToken)

  double weight_bytes() const { return params * bytes_per_value; }
  double kv_bytes_per_token() const { return kv_token_bytes; }
  // What crosses the link per token per step: q, k, v out and o back, every layer.
  double wire_bytes_per_token() const { return layers * bytes_per_value * (2.0 * q_size + 2.0 * kv_size); }
};
// The shape of `config`'s model with its KV pool in `kv_dtype` (bfloat16, float8_e4m3 with its
// scales, or float32): the dtype sets how many tokens fit and how many bytes attention reads.
ModelShape ShapeOf(const ModelConfig& config, DType kv_dtype = DType::kBF16);

struct Efficiency {
  double compute = 0.6;            // of the peak tensor rate a large batch reaches
  double memory_bandwidth = 0.85;  // of the data-sheet memory rate
  double memory_usable = 0.9;      // of device memory for weights and KV
  double link = 0.8;               // of the link rate
  double layer_latency_us = 10;    // per layer round trip, offloaded
};

// The paper's minimum interconnect bandwidth, bytes/s, for a compute device reaching
// `achieved_flops`: wire bytes per token × tokens/s, tokens/s = achieved_flops ÷ 2N. With
// multi-head attention (q = k = v = o = d values) it is 2·e·d·L·achieved_flops ÷ N.
double MinInterconnectBytesPerSecond(const ModelShape& model, double achieved_flops);

struct Design {
  const DeviceKind* compute = nullptr;
  const DeviceKind* memory = nullptr;  // null: colocated (the KV on the compute device)
  int memory_devices = 0;
  bool pipelined = false;              // staggered pipelining overlaps compute and attention
  int64_t kv_capacity_tokens = 0;      // KV slots in all; 0: what the devices' memory holds
  // > 1: a layer split over this many compute devices G (topology `layers:`), each holding its
  // share of the weights. Its batch (every sequence in flight) runs as G batches in a pipeline:
  // each stage time every device computes its layers for one of them, so a step is that of one
  // device with the G devices' memory, memory rate and compute rate on batch / G rows, and a
  // sequence's time per token is G such steps. Every device is priced. Its KV caches live on
  // memory nodes: colocated, it is infeasible.
  int compute_devices = 1;
  // With compute_devices > 1: a tensor-parallel group (topology `tensor_parallel:`) instead of a
  // layer split: one batch on the G devices' added rates, plus two all-reduces of the batch's
  // residual rows a layer over the compute link (a ring's 2 (G - 1) / G of the bytes, and a
  // layer's latency each). Its KV caches live in its own pools: offloaded, it is infeasible.
  bool tensor_parallel = false;
  // "1 x h100 + 2 x h20", "1 x h100 (colocated)", "2 x h200 (layer split) + 4 x h20",
  // "2 x h100 (tensor parallel) (colocated)"
  std::string Name() const;
};

struct Prediction {
  Design design;
  int64_t batch = 0;                 // 0: nothing fits
  double context = 0;                // mean tokens attended per sequence
  double compute_s = 0, attention_s = 0, link_s = 0, step_s = 0;
  double tokens_per_s = 0;
  double hourly_usd = 0;
  double tokens_per_s_per_usd_hour = 0;
  double mfu = 0;                    // achieved ÷ peak compute
  double needed_link_gbs = 0;        // offloaded: bytes/s the link must carry, 1e9
  std::string bottleneck;            // what limits throughput
  int balanced_memory_devices = 0;   // pipelined and offloaded: BalancedMemoryDevices (0: none)
  std::string infeasible;            // why nothing fits; empty when it does
};

// The fewest compute devices of `compute` whose memory holds the weights, up to `most` (0 when
// even that many do not); with `tensor_parallel`, the fewest that also divide the model evenly.
int ComputeDevicesFor(const ModelShape& model, const DeviceKind& compute, const Efficiency& eff, int most = 16,
                      bool tensor_parallel = false);

// The step at a given batch (no capacity or latency checks).
Prediction PredictStep(const ModelShape& model, double context, const Design& design, const Efficiency& eff,
                       int64_t batch);
// The best batch up to `max_batch` that fits the KV memory and keeps a step within `tpot_target_s`
// (0: no target).
Prediction PredictBest(const ModelShape& model, double context, const Design& design, const Efficiency& eff,
                       int64_t max_batch, double tpot_target_s);
// How many memory devices per compute device (per group of `compute_devices`: a layer split, or
// with `tensor_parallel` a tensor-parallel group) give the most tokens/s per dollar when a memory
// device costs `price_ratio` (α) times a compute device, searching 1 to `max_devices`.
int BestMemoryDevices(const ModelShape& model, double context, const DeviceKind& compute, const DeviceKind& memory,
                      double price_ratio, const Efficiency& eff, int64_t max_batch, double tpot_target_s,
                      bool pipelined, int max_devices = 64, int compute_devices = 1, bool tensor_parallel = false);

// The paper's sizing for rotational pipelining with two batches on one compute device: the fewest
// memory devices (1 to `max_devices`) for which a step's attention and link time, at the best
// batch they allow, fit within its compute time, so that each batch's attention hides behind the
// other's slices. 0 when no count up to `max_devices` does. More devices only add KV room.
int BalancedMemoryDevices(const ModelShape& model, double context, const DeviceKind& compute, const DeviceKind& memory,
                          const Efficiency& eff, int64_t max_batch, double tpot_target_s, int max_devices = 64,
                          int compute_devices = 1);

}  // namespace lamina::planner

#endif  // LAMINA_DEPLOY_PLANNER_ANALYTIC_MODEL_H_
