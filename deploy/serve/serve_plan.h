// What `lamina serve` runs: a one-node topology (a coordinator and one compute node that holds the
// weights and a KV pool of its own, attended in its process; optionally a CPU memory node beside
// it for more KV, ServeOptions::cpu_kv_tokens) for a model folder, with the pool
// sized from the device's memory as vLLM's gpu_memory_utilization sizes it:
//
//   pool bytes = total memory x memory_fraction - what others use now - weights - workspace
//
// on a GPU (bf16 weights), and on the CPU the same from the host's available memory (float32
// weights). A pool never exceeds max_batch full contexts (more could not be used), and must hold
// at least one full context.
// Thread-safe: pure functions.
#ifndef LAMINA_DEPLOY_SERVE_SERVE_PLAN_H_
#define LAMINA_DEPLOY_SERVE_SERVE_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_config/model_config.h"
#include "common/tensor/dtype.h"

namespace lamina::serve {

struct ServeOptions {
  std::string model_dir;  // absolute
  std::string device = "cpu";
  std::string host = "127.0.0.1";
  int port = 50051;       // gRPC
  int http_port = 8000;   // OpenAI's HTTP API
  int node_port = 50061;  // the compute node's gRPC
  int max_batch = 64;
  int max_tokens_per_iteration = 4096;
  std::string kv_dtype = "auto";
  int64_t kv_tokens = 0;  // > 0: the pool's size as given, not sized from memory
  double memory_fraction = 0.9;
  std::string api_key_file;  // absolute, or empty
  bool random_weights = false;
  // > 0: a memory node on the host's CPUs holding this many tokens beside the compute node's pool
  // (bfloat16 for a bfloat16 checkpoint), under `balanced` placement: more requests at once than
  // the device's memory holds, without slowing its steps.
  int64_t cpu_kv_tokens = 0;
  int memory_node_port = 50071;  // its gRPC port; its data port is the next one
};

// The memory a device offers: for a GPU its total and free bytes, for the CPU the host's
// available memory as both.
struct DeviceMemoryBudget {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};

// Parameters of a Llama-family model of `config`'s shape, the lm_head included unless tied.
int64_t ParameterCount(const ModelConfig& config);

// Bytes a compute node needs beside its weights and pool: activations of an iteration of
// `max_tokens_per_iteration` tokens, logits, CUDA graphs and libraries' workspaces (a generous
// estimate; vLLM profiles a forward pass instead).
int64_t WorkspaceBytes(const ModelConfig& config, int max_tokens_per_iteration, bool on_gpu);

// The KV pool's tokens for `options` on a device offering `memory`, its pool in `kv_dtype`.
// ResourceExhausted saying how much is missing when not even one full context fits.
absl::StatusOr<int64_t> SizeKvPool(const ServeOptions& options, const ModelConfig& config, DType kv_dtype,
                                   const DeviceMemoryBudget& memory);

// The topology, as YAML, for `options` with a pool of `kv_tokens`.
std::string ServeTopologyYaml(const ServeOptions& options, int64_t kv_tokens);

}  // namespace lamina::serve

#endif  // LAMINA_DEPLOY_SERVE_SERVE_PLAN_H_
