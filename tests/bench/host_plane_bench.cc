// The host data plane: a GPU compute node's per-layer round trip to a CPU memory node on the same
// host (q/k/v from the GPU to pinned host memory, to the memory node, its k/v store and
// attention on the CPU, outputs back to the GPU). Two processes, as in a cluster: this one is the
// compute end (RemoteAttention), a child the memory node (AttentionExecutor with a bfloat16 pool on
// the CPU, behind an AttentionServer).
//
// For each context and batch it times, in the same run, the memory node's attention alone (its
// executor called in this process, no wire: the floor), the round trip over TCP, and over the unix
// socket the tcp transport takes on one host (TcpTransportOptions), and prints unix / tcp, the
// round trip / attention, what the path adds to attention (round trip - attention), and the round
// trip against issue 74's target of 0.25 ms a layer at 32 rows. Without a GPU the rows start and end in
// host memory. Llama-3-8B's layer shape (32 q heads, 8 kv heads, head_dim 128), float32 rows.
//
//   lamina-bench-host-plane [--layers 4] [--contexts 512,2048] [--batches 1,8,32,64] [--reps 20]
//                           [--threads 0]
// --threads: the memory node's attention threads (0: one a core).
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "common/status/status_macros.h"
#include "common/threading/thread_pool.h"
#include "common/transport/transport.h"
#include "compute_node/remote/remote_attention.h"
#include "cuda_runtime_api.h"
#include "kv/attention/attention_executor.h"
#include "memory_node/data_plane/attention_server.h"

namespace lamina {
namespace {

constexpr int64_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int64_t kQ = kQHeads * kHeadDim, kKv = kKvHeads * kHeadDim, kQkv = kQ + 2 * kKv;
constexpr double kTargetMs = 0.25;  // issue 74: a layer's round trip at 32 rows
constexpr int64_t kTargetRows = 32;

struct Options {
  int64_t layers = 4;
  std::vector<int64_t> contexts = {512, 2048};
  std::vector<int64_t> batches = {1, 8, 32, 64};
  int reps = 20;
  int threads = 0;
};

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) out.push_back(std::stoll(std::string(part)));
  return out;
}

int64_t Largest(const std::vector<int64_t>& values) {
  int64_t most = 0;
  for (int64_t v : values) most = std::max(most, v);
  return most;
}

AttentionExecutorOptions PoolOptions(const Options& o) {
  return {o.layers, Largest(o.batches) * (Largest(o.contexts) + 1) + 16, {kQHeads, kKvHeads, kHeadDim, 0}, -1,
          DType::kBF16};
}

// The memory node: serves until its parent closes `stop`.
int MemoryNode(const Options& o, int address_out, int stop) {
  ThreadPool pool(o.threads);
  auto executor = AttentionExecutor::Create(PoolOptions(o), &pool);
  if (!executor.ok()) {
    std::fprintf(stderr, "memory node: %s\n", std::string(executor.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<Transport> tcp = MakeTcpTransport();
  std::mutex mu;
  auto server = AttentionServer::Start(tcp.get(), "127.0.0.1:0", {o.layers, kQ, kKv, kKvHeads}, executor->get(), &mu);
  if (!server.ok()) return 1;
  const std::string address = (*server)->address() + "\n";
  if (write(address_out, address.data(), address.size()) != static_cast<ssize_t>(address.size())) return 1;
  char byte;
  while (read(stop, &byte, 1) > 0) {
  }
  return 0;
}

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The compute end's rows: on the GPU when there is one (copied through pinned host memory each
// layer, as a compute node's host path does), else in host memory alone.
struct Rows {
  std::vector<float> host_qkv, host_out;  // without a GPU
  cuda::DeviceBuffer qkv, out;
  cuda::PinnedBuffer pinned_qkv, pinned_out;
  bool gpu = false;

  static Rows Make(int64_t rows) {
    Rows r;
    std::vector<float> values(rows * kQkv);
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.013f * static_cast<float>(i % 9973));
    r.gpu = HaveGpu();
    if (r.gpu) {
      r.qkv = *cuda::DeviceBuffer::Create(values.size() * sizeof(float));
      r.out = *cuda::DeviceBuffer::Create(rows * kQ * sizeof(float));
      r.pinned_qkv = *cuda::PinnedBuffer::Create(values.size() * sizeof(float));
      r.pinned_out = *cuda::PinnedBuffer::Create(rows * kQ * sizeof(float));
      cudaMemcpy(r.qkv.data(), values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice);
    } else {
      r.host_qkv = std::move(values);
      r.host_out.resize(rows * kQ);
    }
    return r;
  }
  float* qkv_on_host(int64_t n) {
    if (!gpu) return host_qkv.data();
    cudaMemcpy(pinned_qkv.data(), qkv.data(), n * kQkv * sizeof(float), cudaMemcpyDeviceToHost);
    return pinned_qkv.as<float>();
  }
  float* out_on_host() { return gpu ? pinned_out.as<float>() : host_out.data(); }
  void out_to_device(int64_t n) {
    if (gpu) cudaMemcpy(out.data(), pinned_out.data(), n * kQ * sizeof(float), cudaMemcpyHostToDevice);
  }
};

// `batch` sequences of `context` tokens each (ids from `first`), their k/v stored on every layer.
absl::Status Prefill(AttentionService& service, SequenceId first, int64_t batch, int64_t context, int64_t layers) {
  std::vector<Reservation> reservations;
  for (int64_t s = 0; s < batch; ++s) reservations.push_back({first + s, static_cast<int32_t>(context + 1)});
  LAMINA_RETURN_IF_ERROR(service.Reserve(reservations));
  std::vector<float> kv(context * kKv);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.029f * static_cast<float>(i % 7919));
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (int64_t s = 0; s < batch; ++s) {
      LAMINA_RETURN_IF_ERROR(service.StoreKv(layer, first + s, 0, context, kv.data(), kv.data(), kKv));
    }
  }
  return service.FlushStores();
}

// Milliseconds per layer of decode steps over `service` at position `context` (every step writes
// the same slot), after a warm-up step.
double DecodeMs(AttentionService& service, Rows& rows, const std::vector<DecodeEntry>& entries, int64_t layers,
                int reps) {
  const int64_t n = static_cast<int64_t>(entries.size());
  absl::Time start;
  for (int rep = -1; rep < reps; ++rep) {
    if (rep == 0) start = absl::Now();
    for (int64_t layer = 0; layer < layers; ++layer) {
      const float* qkv = rows.qkv_on_host(n);
      absl::Status s = service.Decode(layer, entries, qkv, {kQkv, 0, kQ, kQ + kKv}, rows.out_on_host(), kQ);
      if (!s.ok()) {
        std::fprintf(stderr, "decode: %s\n", std::string(s.message()).c_str());
        return -1;
      }
      rows.out_to_device(n);
    }
  }
  return absl::ToDoubleMilliseconds(absl::Now() - start) / (reps * layers);
}

int Run(const Options& o) {
  int address_pipe[2], stop_pipe[2];
  if (pipe(address_pipe) != 0 || pipe(stop_pipe) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(address_pipe[0]);
    close(stop_pipe[1]);
    _exit(MemoryNode(o, address_pipe[1], stop_pipe[0]));
  }
  close(address_pipe[1]);
  close(stop_pipe[0]);
  std::string address;
  char c;
  while (read(address_pipe[0], &c, 1) == 1 && c != '\n') address += c;
  if (address.empty()) {
    std::fprintf(stderr, "the memory node did not start\n");
    return 1;
  }
  int status_code = 0;
  {
    std::unique_ptr<Transport> tcp = MakeTcpTransport(std::nullopt, {.same_host_unix_sockets = false});
    std::unique_ptr<Transport> same_host = MakeTcpTransport();
    const AttentionWireShape shape{o.layers, kQ, kKv, kKvHeads};
    RemoteAttention over_tcp(tcp.get(), {{"m", address}}, shape);
    RemoteAttention remote(same_host.get(), {{"m", address}}, shape);
    ThreadPool pool(o.threads);
    auto local = AttentionExecutor::Create(PoolOptions(o), &pool);
    if (!local.ok()) return 1;
    Rows rows = Rows::Make(Largest(o.batches));
    std::printf("host data plane: %s compute end, CPU memory node (bfloat16 pool, %d threads), %lld layers\n",
                rows.gpu ? "GPU" : "CPU", pool.num_threads(), static_cast<long long>(o.layers));
    std::printf("%8s %6s %11s %11s %11s %10s %10s %11s %10s\n", "context", "rows", "attention", "tcp", "unix",
                "unix/tcp", "rt/attn", "path adds", "rt/target");
    SequenceId next = 1;
    for (int64_t context : o.contexts) {
      for (int64_t batch : o.batches) {
        std::vector<DecodeEntry> entries;
        for (int64_t s = 0; s < batch; ++s) {
          entries.push_back({next + s, static_cast<int32_t>(context)});
          if (!remote.Assign(next + s, "m").ok() || !over_tcp.Assign(next + s, "m").ok()) return 1;
        }
        absl::Status prefilled = Prefill(remote, next, batch, context, o.layers);
        if (prefilled.ok()) prefilled = Prefill(**local, next, batch, context, o.layers);
        if (!prefilled.ok()) {
          std::fprintf(stderr, "prefill: %s\n", std::string(prefilled.message()).c_str());
          status_code = 1;
          break;
        }
        const double attention = DecodeMs(**local, rows, entries, o.layers, o.reps);
        const double tcp_ms = DecodeMs(over_tcp, rows, entries, o.layers, o.reps);
        const double round_trip = DecodeMs(remote, rows, entries, o.layers, o.reps);
        const bool target_row = batch == kTargetRows;
        std::printf("%8lld %6lld %9.3f ms %8.3f ms %8.3f ms %10.2f %10.2f %8.3f ms %10s\n",
                    static_cast<long long>(context), static_cast<long long>(batch), attention, tcp_ms, round_trip,
                    round_trip / tcp_ms, round_trip / attention, round_trip - attention,
                    target_row ? absl::StrFormat("%.2f", round_trip / kTargetMs).c_str() : "");
        for (const DecodeEntry& e : entries) {
          remote.Free(e.seq);
          (*local)->Free(e.seq);
        }
        next += batch;
      }
    }
  }
  close(stop_pipe[1]);
  int child_status = 0;
  waitpid(child, &child_status, 0);
  return status_code;
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) {
  lamina::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--layers") o.layers = std::stoll(value);
    else if (flag == "--contexts") o.contexts = lamina::ParseList(value);
    else if (flag == "--batches") o.batches = lamina::ParseList(value);
    else if (flag == "--reps") o.reps = std::stoi(value);
    else if (flag == "--threads") o.threads = std::stoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  return lamina::Run(o);
}
