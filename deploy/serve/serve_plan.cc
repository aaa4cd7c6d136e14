#include "deploy/serve/serve_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/topology/kv_dtype.h"

namespace lamina::serve {

int64_t ParameterCount(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t per_layer = c.qkv_size() * h + h * c.q_size() + 3 * c.intermediate_size * h + 2 * h +
                            (c.attention_bias ? c.qkv_size() : 0);
  return c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + c.num_layers * per_layer + h;
}

int64_t WorkspaceBytes(const ModelConfig& c, int max_tokens_per_iteration, bool on_gpu) {
  // Per token of an iteration: float32 activations of the widest slices, and its logits.
  const int64_t per_token = 4 * (c.qkv_size() + 2 * c.intermediate_size + 4 * c.hidden_size) + 4 * c.vocab_size;
  const int64_t fixed = on_gpu ? (int64_t{2} << 30) : (int64_t{512} << 20);
  return fixed + per_token * max_tokens_per_iteration;
}

absl::StatusOr<int64_t> SizeKvPool(const ServeOptions& options, const ModelConfig& config, DType kv_dtype,
                                   const DeviceMemoryBudget& memory) {
  const int64_t per_token = KvBytesPerToken(kv_dtype, config);
  const int64_t most_useful = static_cast<int64_t>(options.max_batch) * config.max_position_embeddings;
  if (options.kv_tokens > 0) return options.kv_tokens;
  const bool on_gpu = options.device != "cpu";
  const int64_t weights = ParameterCount(config) * (on_gpu ? 2 : 4);
  const int64_t workspace = WorkspaceBytes(config, options.max_tokens_per_iteration, on_gpu);
  const int64_t used_by_others = memory.total_bytes - memory.free_bytes;
  const int64_t budget = static_cast<int64_t>(static_cast<double>(memory.total_bytes) * options.memory_fraction) -
                         used_by_others - weights - workspace;
  const int64_t tokens = std::min(most_useful, budget / per_token);
  if (tokens < config.max_position_embeddings) {
    const double gib = 1.0 / (int64_t{1} << 30);
    return absl::ResourceExhaustedError(absl::StrCat(
        options.device, " has too little memory for one full context of ", config.max_position_embeddings,
        " tokens (", (config.max_position_embeddings * per_token) * gib, " GiB of KV) beside ", weights * gib,
        " GiB of weights and ", workspace * gib, " GiB of workspace: ", budget * gib, " GiB are left of ",
        options.memory_fraction, " x ", memory.total_bytes * gib, " GiB with ", used_by_others * gib,
        " GiB in use; raise --memory-fraction, or give --kv-tokens"));
  }
  return tokens;
}

std::string ServeTopologyYaml(const ServeOptions& options, int64_t kv_tokens) {
  std::string yaml = absl::StrCat("# Written by lamina serve: one compute node with its own KV pool",
                                  options.cpu_kv_tokens > 0 ? ", and a CPU memory node beside it" : "",
                                  " (deploy/TOPOLOGY.md).\n",
                                  "model: ", options.model_dir, "\n");
  if (options.random_weights) absl::StrAppend(&yaml, "weights: random\n");
  absl::StrAppend(&yaml, "coordinator:\n  host: ", options.host, "\n  port: ", options.port, "\n  http_port: ",
                  options.http_port, "\n");
  if (!options.api_key_file.empty()) absl::StrAppend(&yaml, "  api_key_file: ", options.api_key_file, "\n");
  absl::StrAppend(&yaml, "scheduler:\n  max_batch: ", options.max_batch,
                  "\n  max_tokens_per_iteration: ", options.max_tokens_per_iteration, "\n");
  if (options.cpu_kv_tokens > 0) absl::StrAppend(&yaml, "  placement: balanced\n");
  absl::StrAppend(&yaml, "nodes:\n  - name: compute-0\n    role: compute\n    host: ", options.host,
                  "\n    port: ", options.node_port, "\n    device: ", options.device,
                  "\n    kv_capacity_tokens: ", kv_tokens, "\n    kv_dtype: ", options.kv_dtype, "\n");
  if (options.cpu_kv_tokens > 0) {
    absl::StrAppend(&yaml, "  - name: memory-0\n    role: memory\n    host: ", options.host,
                    "\n    port: ", options.memory_node_port, "\n    data_port: ", options.memory_node_port + 1,
                    "\n    device: cpu\n    kv_capacity_tokens: ", options.cpu_kv_tokens, "\n");
  }
  return yaml;
}

}  // namespace lamina::serve
