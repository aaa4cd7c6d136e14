#include "deploy/cli/serve_command.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/cuda/device.h"
#include "common/flags/flags.h"
#include "common/model_config/model_config.h"
#include "common/process/host_memory.h"
#include "common/status/status_macros.h"
#include "common/topology/kv_dtype.h"
#include "deploy/cli/up_command.h"
#include "deploy/serve/serve_plan.h"

namespace lamina::cli {

const char kServeUsage[] =
    "usage: lamina serve --model DIR [--device cpu|cuda:N] [--port P] [--http-port H] [flags]\n"
    "  Serves a Hugging Face model folder with one command: OpenAI's HTTP API on --http-port\n"
    "  (default 8000) and Lamina's gRPC API on --port (default 50051), from a coordinator and one\n"
    "  compute node holding the weights and a KV pool of its own on --device (default cpu). The\n"
    "  pool takes what --memory-fraction of the device leaves after the weights and a workspace.\n"
    "  Runs until Ctrl-C or SIGTERM, which drains the requests in flight.\n"
    "flags:\n"
    "  --host ADDR            where to listen (default 127.0.0.1)\n"
    "  --node-port P          the compute node's gRPC port (default 50061)\n"
    "  --memory-fraction F    share of the device's memory Lamina may use in all (default 0.9)\n"
    "  --kv-tokens N          the KV pool's tokens, instead of sizing it from memory\n"
    "  --kv-dtype T           auto (default), bfloat16, float8_e4m3 or float32 (CPU)\n"
    "  --cpu-kv-tokens N      also a memory node on this host's CPUs holding N tokens: more\n"
    "                         requests at once than the device holds (balanced placement)\n"
    "  --memory-node-port P   that memory node's gRPC port, its data port the next (default 50071)\n"
    "  --max-batch N          sequences decoded together at most (default 64)\n"
    "  --api-key-file FILE    client API keys, one a line (docs/security.md)\n"
    "  --weights random       random weights of the model's shape, for experiments\n"
    "  --write-topology FILE  where to write the topology used (default: in the log folder), the\n"
    "                         start of a bigger one (deploy/TOPOLOGY.md)\n"
    "  --log-dir DIR          the processes' logs (default /tmp/lamina-serve-PID)\n"
    "  --timeout S            how long start-up may take (default 600)\n";

namespace {

absl::Status Serve(const std::vector<std::string>& args, int* exit_code) {
  LAMINA_ASSIGN_OR_RETURN(
      Flags flags,
      Flags::Parse(args,
                   {"model", "device", "host", "port", "http-port", "node-port", "memory-fraction", "kv-tokens",
                    "kv-dtype", "max-batch", "api-key-file", "weights", "write-topology", "log-dir", "timeout",
                    "cpu-kv-tokens", "memory-node-port"},
                   {}));
  if (!flags.Has("model")) return absl::InvalidArgumentError("--model DIR is required");
  serve::ServeOptions options;
  options.model_dir = std::filesystem::absolute(flags.String("model", "")).lexically_normal().string();
  options.device = flags.String("device", options.device);
  options.host = flags.String("host", options.host);
  LAMINA_ASSIGN_OR_RETURN(int64_t port, flags.Int("port", options.port));
  LAMINA_ASSIGN_OR_RETURN(int64_t http_port, flags.Int("http-port", options.http_port));
  LAMINA_ASSIGN_OR_RETURN(int64_t node_port, flags.Int("node-port", options.node_port));
  LAMINA_ASSIGN_OR_RETURN(int64_t max_batch, flags.Int("max-batch", options.max_batch));
  LAMINA_ASSIGN_OR_RETURN(options.kv_tokens, flags.Int("kv-tokens", 0));
  LAMINA_ASSIGN_OR_RETURN(options.memory_fraction, flags.Double("memory-fraction", options.memory_fraction));
  options.port = static_cast<int>(port);
  options.http_port = static_cast<int>(http_port);
  options.node_port = static_cast<int>(node_port);
  options.max_batch = static_cast<int>(max_batch);
  options.kv_dtype = flags.String("kv-dtype", options.kv_dtype);
  if (options.memory_fraction <= 0 || options.memory_fraction > 1) {
    return absl::InvalidArgumentError("--memory-fraction must be in (0, 1]");
  }
  if (options.kv_tokens < 0) return absl::InvalidArgumentError("--kv-tokens must be positive");
  LAMINA_ASSIGN_OR_RETURN(options.cpu_kv_tokens, flags.Int("cpu-kv-tokens", 0));
  if (options.cpu_kv_tokens < 0) return absl::InvalidArgumentError("--cpu-kv-tokens must be positive");
  LAMINA_ASSIGN_OR_RETURN(int64_t memory_node_port, flags.Int("memory-node-port", options.memory_node_port));
  if (memory_node_port < 1 || memory_node_port > 65534) {
    return absl::InvalidArgumentError("--memory-node-port must be from 1 to 65534 (its data port is the next)");
  }
  options.memory_node_port = static_cast<int>(memory_node_port);
  const std::string weights = flags.String("weights", "checkpoint");
  if (weights != "checkpoint" && weights != "random") {
    return absl::InvalidArgumentError(absl::StrCat("--weights: expected 'checkpoint' or 'random', got '", weights, "'"));
  }
  options.random_weights = weights == "random";
  if (flags.Has("api-key-file")) {
    options.api_key_file = std::filesystem::absolute(flags.String("api-key-file", "")).string();
  }

  LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  LAMINA_ASSIGN_OR_RETURN(DeviceSpec device, ParseDevice(options.device));
  absl::StatusOr<DType> kv_dtype = ChooseKvDtype(options.kv_dtype, config, device.is_cuda);
  if (!kv_dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", kv_dtype.status().message()));
  serve::DeviceMemoryBudget memory;
  if (device.is_cuda) {
    LAMINA_ASSIGN_OR_RETURN(GpuMemory gpu, QueryGpuMemory(device));
    memory = {gpu.total_bytes, gpu.free_bytes};
  } else {
    memory = {AvailableHostMemory(), AvailableHostMemory()};
  }
  absl::StatusOr<int64_t> kv_tokens = serve::SizeKvPool(options, config, *kv_dtype, memory);
  if (!kv_tokens.ok()) return kv_tokens.status();

  const std::string log_dir = flags.String("log-dir", absl::StrCat("/tmp/lamina-serve-", ::getpid()));
  std::filesystem::create_directories(log_dir);
  const std::string topology = flags.String("write-topology", log_dir + "/topology.yaml");
  {
    std::ofstream out(topology);
    out << serve::ServeTopologyYaml(options, *kv_tokens);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(topology, ": cannot be written"));
  }
  const double gib = 1.0 / (int64_t{1} << 30);
  std::fprintf(stderr, "lamina serve: %s on %s: %.2f GiB of weights, a KV pool of %lld tokens (%.2f GiB of %s)\n",
               std::filesystem::path(options.model_dir).filename().c_str(), options.device.c_str(),
               serve::ParameterCount(config) * (device.is_cuda ? 2 : 4) * gib, static_cast<long long>(*kv_tokens),
               *kv_tokens * KvBytesPerToken(*kv_dtype, config) * gib, KvDtypeName(*kv_dtype));
  if (options.cpu_kv_tokens > 0) {
    std::fprintf(stderr, "lamina serve: and a memory node on the CPUs with %lld tokens (balanced placement)\n",
                 static_cast<long long>(options.cpu_kv_tokens));
  }
  std::fprintf(stderr, "lamina serve: topology in %s\n", topology.c_str());
  *exit_code = RunUp({topology, "--log-dir", log_dir, "--timeout", flags.String("timeout", "600")});
  return absl::OkStatus();
}

}  // namespace

int RunServe(const std::vector<std::string>& args) {
  // As `lamina up` does, before any thread exists (asking a GPU for its memory starts some).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  int exit_code = 0;
  absl::Status status = Serve(args, &exit_code);
  if (status.ok()) return exit_code;
  std::fprintf(stderr, "lamina serve: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

}  // namespace lamina::cli
