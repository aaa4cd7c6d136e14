#include "tests/integration/cluster_harness.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/security/self_signed.h"
#include "common/status/status_macros.h"
#include "tests/support/golden.h"

namespace lamina::testing {

// Ports this process has handed out: never twice.
std::set<int>& HandedOut() {
  static std::set<int> handed_out;
  return handed_out;
}

int FreePort() {
  // Never the band of deploy/topologies' fixed ports, which experiment_test's clusters take while
  // other tests run beside it.
  constexpr int kDeployPortsFirst = 50000, kDeployPortsLast = 50999;
  std::set<int>& handed_out = HandedOut();
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                       ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    ::close(fd);
    if (!bound) continue;
    int port = ntohs(addr.sin_port);
    if (port >= kDeployPortsFirst && port <= kDeployPortsLast) continue;
    if (handed_out.insert(port).second) return port;
  }
}

// Whether `port` on loopback can be bound now.
bool Bindable(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// The first of `count` consecutive free ports (a tensor-parallel group's ranks take port + rank).
int FreePorts(int count) {
  for (;;) {
    const int first = FreePort();
    bool all = first + count - 1 <= 65535;
    for (int i = 1; all && i < count; ++i) all = HandedOut().count(first + i) == 0 && Bindable(first + i);
    if (all) {
      for (int i = 1; i < count; ++i) HandedOut().insert(first + i);
      return first;
    }
  }
}

std::pair<int, std::string> RunCli(const std::string& args) {
  std::string command = std::string(LAMINA_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

absl::StatusOr<std::unique_ptr<ClusterHarness>> ClusterHarness::Start(const ClusterOptions& options) {
  // FreePort's ports come from the range the kernel hands out for outgoing connections (and NCCL
  // for its own), so one may be taken again before `lamina up` binds it: then try new ones.
  absl::StatusOr<std::unique_ptr<ClusterHarness>> started;
  for (int attempt = 0; attempt < 3; ++attempt) {
    started = StartOnce(options);
    if (started.ok() || started.status().message().find("already in use") == absl::string_view::npos) break;
  }
  return started;
}

absl::StatusOr<std::unique_ptr<ClusterHarness>> ClusterHarness::StartOnce(const ClusterOptions& options) {
  std::unique_ptr<ClusterHarness> h(new ClusterHarness());
  const int coordinator_port = FreePort();
  h->endpoint_ = absl::StrCat("127.0.0.1:", coordinator_port);
  // A path is written absolute: the topology file lives in a temporary folder.
  const std::string model = options.model.find('/') == std::string::npos
                                ? ModelDir(options.model)
                                : std::filesystem::absolute(options.model).string();
  std::string yaml = absl::StrCat("model: ", model, "\n");
  if (!options.cluster_secret.empty()) {
    absl::StrAppend(&yaml, "cluster_secret_file: ", h->dir_.Write("cluster.secret", options.cluster_secret + "\n"), "\n");
  }
  if (options.random_weights_seed) {
    absl::StrAppend(&yaml, "weights: random\nweights_seed: ", *options.random_weights_seed, "\n");
  }
  absl::StrAppend(&yaml, "pipelining: ", options.pipelining, "\ncoordinator:\n  port: ", coordinator_port, "\n");
  if (!options.api_key.empty()) {
    absl::StrAppend(&yaml, "  api_key_file: ", h->dir_.Write("api.keys", "# a test's key\n" + options.api_key + "\n"),
                    "\n  open_probes: ", options.open_probes ? "true" : "false", "\n");
  }
  if (options.tls) {
    h->tls_ca_ = h->dir_.path() + "/coordinator.pem";
    const std::string key = h->dir_.path() + "/coordinator.key";
    LAMINA_RETURN_IF_ERROR(WriteSelfSignedCertificate({"127.0.0.1", "localhost"}, 1, h->tls_ca_, key));
    absl::StrAppend(&yaml, "  tls:\n    cert: ", h->tls_ca_, "\n    key: ", key, "\n");
  }
  if (options.http) {
    const int http_port = FreePort();
    h->http_address_ = absl::StrCat("127.0.0.1:", http_port);
    absl::StrAppend(&yaml, "  http_port: ", http_port, "\n");
  }
  absl::StrAppend(&yaml, "scheduler:\n  max_batch: ", options.max_batch,
                  "\n  rotational_above: ", options.rotational_above,
                  "\n  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1500\n  prefix_caching: ",
                  options.prefix_caching ? "true" : "false", "\n  stagger: ", options.stagger ? "true" : "false",
                  "\n  max_tokens_per_iteration: ", options.max_tokens_per_iteration,
                  "\n  chunked_prefill: ", options.chunked_prefill ? "true" : "false",
                  options.placement.empty() ? "" : "\n  placement: " + options.placement,
                  options.max_migrations ? absl::StrCat("\n  max_migrations: ", *options.max_migrations) : "",
                  // Tests stop their clusters with requests still running at times: a short drain.
                  "\n  shutdown_grace_s: ", options.shutdown_grace_s.value_or(2),
                  "\nnodes:\n");
  for (int i = 0; i < options.compute_nodes; ++i) {
    const std::string device = i < static_cast<int>(options.compute_devices.size()) ? options.compute_devices[i]
                                                                                    : options.device;
    const int ranks = options.tensor_parallel;
    absl::StrAppend(&yaml, "  - name: compute-", i, "\n    role: compute\n    device: ", device,
                    "\n    port: ", FreePorts(ranks), "\n    data_port: ", FreePorts(ranks), "\n");
    if (ranks > 1) absl::StrAppend(&yaml, "    tensor_parallel: ", ranks, "\n");
    if (options.chunk_rows || options.line_rows) absl::StrAppend(&yaml, "    tuning:\n");
    if (options.chunk_rows) absl::StrAppend(&yaml, "      chunk_rows: ", *options.chunk_rows, "\n");
    if (options.line_rows) absl::StrAppend(&yaml, "      line_rows: ", *options.line_rows, "\n");
    if (options.compute_kv_capacity_tokens > 0) {
      absl::StrAppend(&yaml, "    kv_capacity_tokens: ", options.compute_kv_capacity_tokens, "\n");
    }
    if (i < static_cast<int>(options.layers.size())) {
      absl::StrAppend(&yaml, "    layers: [", options.layers[i].first, ", ", options.layers[i].second, "]\n");
    }
  }
  for (int i = 0; i < options.memory_nodes; ++i) {
    const std::string device = i < static_cast<int>(options.memory_devices.size()) ? options.memory_devices[i]
                                                                                   : options.device;
    absl::StrAppend(&yaml, "  - name: memory-", i, "\n    role: memory\n    device: ", device,
                    options.transport.empty() ? "" : "\n    transport: " + options.transport,
                    options.kv_dtype.empty() ? "" : "\n    kv_dtype: " + options.kv_dtype, "\n    port: ", FreePort(),
                    "\n    data_port: ", FreePort(), "\n    kv_capacity_tokens: ", options.kv_capacity_tokens, "\n");
  }
  const std::string topology = h->dir_.Write("topology.yaml", yaml);
  h->topology_path_ = topology;
  const std::string out = h->dir_.path() + "/up.out";
  std::fflush(nullptr);  // the child must not inherit (and flush again) our buffered output
  h->up_pid_ = ::fork();
  if (h->up_pid_ == 0) {
    FILE* f = std::freopen(out.c_str(), "w", stdout);
    (void)f;
    ::dup2(STDOUT_FILENO, STDERR_FILENO);
    ::execl(LAMINA_BINARY, LAMINA_BINARY, "up", topology.c_str(), "--log-dir", (h->dir_.path() + "/logs").c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (h->UpOutput().find("Lamina is up") == std::string::npos) {
    int status;
    if (::waitpid(h->up_pid_, &status, WNOHANG) == h->up_pid_) {
      h->up_pid_ = -1;
      return absl::InternalError("lamina up exited: " + h->UpOutput());
    }
    if (absl::Now() > deadline) return absl::DeadlineExceededError("cluster not up: " + h->UpOutput());
    absl::SleepFor(absl::Milliseconds(50));
  }
  LAMINA_ASSIGN_OR_RETURN(h->client_,
                          cli::ClusterClient::Connect(h->endpoint_, {options.api_key, ClientTls{options.tls, h->tls_ca_}}));
  return h;
}

ClusterHarness::~ClusterHarness() {
  if (up_pid_ <= 0) return;
  ::kill(up_pid_, SIGTERM);
  int status;
  ::waitpid(up_pid_, &status, 0);
}

std::string ClusterHarness::UpOutput() const { return ReadText(dir_.path() + "/up.out"); }

std::string ClusterHarness::NodeLog(const std::string& name) const {
  return ReadText(dir_.path() + "/logs/" + name + ".log");
}

std::string ClusterHarness::ReadText(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "";
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  std::fclose(f);
  return text;
}

absl::StatusOr<int64_t> ClusterHarness::NodePid(const std::string& node) {
  auto status = client_->Status(absl::Seconds(2));
  if (!status.ok()) return status.status();
  for (const auto& n : status->nodes()) {
    if (n.name() == node) return n.pid();
  }
  return absl::NotFoundError(node);
}

absl::StatusOr<pid_t> ClusterHarness::CoordinatorPid() const {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = ReadText(entry.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("lamina-coordinator") != std::string::npos && cmdline.find(topology_path_) != std::string::npos) {
      return static_cast<pid_t>(std::stol(name));
    }
  }
  return absl::NotFoundError("no coordinator process for " + topology_path_);
}

void ClusterHarness::SignalUp(int signal) const { ::kill(up_pid_, signal); }

absl::StatusOr<int> ClusterHarness::WaitForUp(absl::Duration most) {
  const absl::Time deadline = absl::Now() + most;
  while (absl::Now() < deadline) {
    int status = 0;
    if (::waitpid(up_pid_, &status, WNOHANG) == up_pid_) {
      up_pid_ = -1;
      return status;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError("lamina up did not exit");
}

}  // namespace lamina::testing
