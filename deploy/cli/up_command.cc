#include "deploy/cli/up_command.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/flags/flags.h"
#include "common/net/sockets.h"
#include "common/process/child_process.h"
#include "common/status/status_macros.h"
#include "common/topology/shared_gpus.h"
#include "common/topology/topology.h"
#include "deploy/client/cluster_client.h"

namespace lamina::cli {

const char kUpUsage[] =
    "usage: lamina up TOPOLOGY.yaml [--host ADDR] [--log-dir DIR] [--timeout SECONDS]\n"
    "  Starts the cluster a topology describes (schema: deploy/TOPOLOGY.md), waits until it is\n"
    "  healthy and prints its endpoint, and restarts any process that dies (after 1, 2, 4, ... s;\n"
    "  one that dies 5 times within 10 minutes is left down). Ctrl-C or SIGTERM drains the cluster:\n"
    "  the coordinator admits nothing more and lets the requests in flight finish (up to\n"
    "  scheduler.shutdown_grace_s), then every process stops.\n"
    "  --host ADDR  on a cluster of several machines: start only the processes whose `host` is ADDR\n"
    "               (run it on every machine, each with its own address; docs/deploy.md)\n";

namespace {

struct Child {
  std::string name;
  std::vector<std::string> argv;
  std::string log;
  pid_t pid = -1;
  bool running = false;
  // Restarts: when each recent death came (within kRestartWindow), and when the next start is due
  // (InfiniteFuture: none; the child is up, or left down).
  std::vector<absl::Time> deaths;
  absl::Time restart_at = absl::InfiniteFuture();
};

// A child that dies kMostRestarts times within kRestartWindow is left down.
constexpr int kMostRestarts = 5;
constexpr absl::Duration kRestartWindow = absl::Minutes(10);

std::string ExitDescription(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "stopped";
}

absl::Status Spawn(Child* child) {
  LAMINA_ASSIGN_OR_RETURN(child->pid, SpawnLogged(child->argv, child->log));
  child->running = true;
  return absl::OkStatus();
}

// Reaps exited children; reports each, naming its log.
void Reap(std::vector<Child>& children, bool report) {
  for (;;) {
    int status;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (Child& c : children) {
      if (c.pid != pid) continue;
      c.running = false;
      if (report) {
        std::fprintf(stderr, "lamina up: %s (pid %d) %s; its log: %s\n    %s\n", c.name.c_str(), pid,
                     ExitDescription(status).c_str(), c.log.c_str(), TailOfFile(c.log, 5, "\n    ").c_str());
      }
    }
  }
}

// Plans a restart of each child that died since the last call: after 1, 2, 4 ... s (the backoff
// doubling with each death in the window), or never once it died kMostRestarts times in it.
void PlanRestarts(std::vector<Child>& children) {
  const absl::Time now = absl::Now();
  for (Child& c : children) {
    if (c.running || c.restart_at != absl::InfiniteFuture() || c.pid < 0) continue;
    c.deaths.push_back(now);
    c.deaths.erase(std::remove_if(c.deaths.begin(), c.deaths.end(),
                                  [&](absl::Time t) { return now - t > kRestartWindow; }),
                   c.deaths.end());
    if (static_cast<int>(c.deaths.size()) >= kMostRestarts) {
      std::fprintf(stderr, "lamina up: %s died %d times within %s: left down\n", c.name.c_str(), kMostRestarts,
                   absl::FormatDuration(kRestartWindow).c_str());
      c.pid = -1;  // never again
      continue;
    }
    const absl::Duration backoff = absl::Seconds(1 << (c.deaths.size() - 1));
    c.restart_at = now + backoff;
    std::fprintf(stderr, "lamina up: restarting %s in %s\n", c.name.c_str(), absl::FormatDuration(backoff).c_str());
  }
}

// Starts the children whose restart is due.
void Restart(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.running || absl::Now() < c.restart_at) continue;
    c.restart_at = absl::InfiniteFuture();
    absl::Status spawned = Spawn(&c);
    if (spawned.ok()) {
      std::fprintf(stderr, "lamina up: restarted %s (pid %d)\n", c.name.c_str(), c.pid);
    } else {
      std::fprintf(stderr, "lamina up: cannot restart %s: %s\n", c.name.c_str(),
                   std::string(spawned.message()).c_str());
    }
  }
}

// Sends SIGTERM to `child` and waits up to `grace` for it to exit (then SIGKILL).
void StopOne(std::vector<Child>& children, Child& child, absl::Duration grace) {
  if (!child.running) return;
  ::kill(child.pid, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (child.running) {
    Reap(children, /*report=*/false);
    if (!child.running) break;
    if (absl::Now() > deadline) ::kill(child.pid, SIGKILL);
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void StopAll(std::vector<Child>& children) {
  // Compute nodes first, then memory nodes, the coordinator last: clients see clean errors.
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (it->running) ::kill(it->pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (;;) {
    Reap(children, /*report=*/false);
    bool any = false;
    for (const Child& c : children) any |= c.running;
    if (!any) return;
    if (absl::Now() > deadline) {
      for (Child& c : children) {
        if (c.running) ::kill(c.pid, SIGKILL);
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// Whether `host` is an address of this machine (one a socket can be bound to).
bool IsLocalAddress(const std::string& host) {
  absl::StatusOr<sockaddr_in> address = ResolveIpv4(host + ":0");
  if (!address.ok()) return false;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) == 0;
  ::close(fd);
  return bound;
}

std::string ProgramDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

// Waits for SIGINT or SIGTERM for up to `timeout`; returns the signal or 0.
int WaitForSignal(absl::Duration timeout) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  timespec ts = absl::ToTimespec(timeout);
  int sig = ::sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

absl::Status Up(const std::vector<std::string>& args, int* exit_code) {
  // The topology comes first: lamina up TOPOLOGY.yaml [flags].
  if (args.empty() || args[0].rfind("--", 0) == 0) return absl::InvalidArgumentError("missing TOPOLOGY.yaml");
  const std::string& topology_path = args[0];
  LAMINA_ASSIGN_OR_RETURN(Flags flags,
                          Flags::Parse({args.begin() + 1, args.end()}, {"log-dir", "timeout", "host"}, {}));
  const std::string host = flags.String("host", "");  // "": every process of the topology
  LAMINA_ASSIGN_OR_RETURN(int64_t timeout_s, flags.Int("timeout", 120));
  // Everything is checked before anything starts.
  absl::StatusOr<Topology> loaded = LoadTopology(topology_path);
  if (!loaded.ok()) {
    *exit_code = 2;
    return loaded.status();
  }
  const Topology& topology = *loaded;
  if (host.empty()) {
    // Every process starts here: each host must be one of this machine's addresses.
    std::vector<std::string> elsewhere;
    for (const NodeSpec& node : topology.nodes) {
      if (!IsLocalAddress(node.host)) elsewhere.push_back(absl::StrCat(node.name, " (", node.host, ")"));
    }
    if (!IsLocalAddress(topology.coordinator_host)) {
      elsewhere.push_back(absl::StrCat("the coordinator (", topology.coordinator_host, ")"));
    }
    if (!elsewhere.empty()) {
      *exit_code = 2;
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(elsewhere, ", "), " of ", topology_path,
          " are on other machines: run `lamina up ", topology_path, " --host ADDR` on each machine (docs/deploy.md)"));
    }
  }
  absl::Status ports = CheckPortsFree(topology, host);
  if (!ports.ok()) {
    *exit_code = 2;
    return ports;
  }
  for (const std::string& warning : SharedGpuWarnings(topology)) {
    std::fprintf(stderr, "lamina up: warning: %s\n", warning.c_str());
  }
  const std::string bin = ProgramDir();
  for (const char* program : {"lamina-coordinator", "lamina-compute-node", "lamina-memory-node"}) {
    if (::access((bin + "/" + program).c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(bin, "/", program, " is missing (build all targets)"));
    }
  }
  std::string log_dir = flags.String("log-dir", absl::StrCat("/tmp/lamina-up-", ::getpid()));
  std::filesystem::create_directories(log_dir);

  std::vector<Child> children;
  const std::string abs_topology = std::filesystem::absolute(topology_path).string();
  auto child = [](std::string name, std::vector<std::string> argv, std::string log) {
    Child c;
    c.name = std::move(name);
    c.argv = std::move(argv);
    c.log = std::move(log);
    return c;
  };
  if (host.empty() || host == topology.coordinator_host) {
    children.push_back(child("coordinator", {bin + "/lamina-coordinator", "--topology", abs_topology},
                             log_dir + "/coordinator.log"));
  }
  for (NodeKind kind : {NodeKind::kMemory, NodeKind::kCompute}) {
    for (const NodeSpec& process : topology.nodes) {  // every process, tensor-parallel ranks included
      const NodeSpec* node = &process;
      if (node->kind != kind || (!host.empty() && node->host != host)) continue;
      std::string program = kind == NodeKind::kMemory ? "/lamina-memory-node" : "/lamina-compute-node";
      children.push_back(child(node->name, {bin + program, "--topology", abs_topology, "--name", node->name},
                               log_dir + "/" + node->name + ".log"));
    }
  }

  // With probes behind the API keys, the health checks present one (the file's first, or
  // LAMINA_API_KEY's); with TLS they trust what the nodes trust.
  ClientAccess probe;
  if (!topology.open_probes && !topology.api_key_file.empty()) {
    std::ifstream keys(topology.api_key_file);
    for (std::string line; probe.api_key.empty() && std::getline(keys, line);) {
      const std::string key(absl::StripAsciiWhitespace(line));
      if (!key.empty() && key[0] != '#') probe.api_key = key;
    }
  }
  if (probe.api_key.empty() && std::getenv("LAMINA_API_KEY") != nullptr) probe.api_key = std::getenv("LAMINA_API_KEY");
  probe.tls = topology.coordinator_tls.ForClients();
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ClusterClient> client,
                          ClusterClient::Connect(topology.coordinator_address(), probe));

  if (children.empty()) {
    *exit_code = 2;
    std::vector<std::string> hosts = {topology.coordinator_host};
    for (const NodeSpec& node : topology.nodes) {
      if (std::find(hosts.begin(), hosts.end(), node.host) == hosts.end()) hosts.push_back(node.host);
    }
    return absl::InvalidArgumentError(absl::StrCat("--host ", host, ": no process of ", topology_path,
                                                   " is on that host (its hosts: ", absl::StrJoin(hosts, ", "), ")"));
  }
  std::fprintf(stderr, "lamina up: starting %zu processes%s (logs in %s)\n", children.size(),
               host.empty() ? "" : absl::StrCat(" on ", host).c_str(), log_dir.c_str());
  for (Child& c : children) {
    absl::Status spawned = Spawn(&c);
    if (!spawned.ok()) {
      StopAll(children);
      return spawned;
    }
  }

  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  std::string waiting_for;
  for (;;) {
    Reap(children, /*report=*/true);
    for (const Child& c : children) {
      if (!c.running) {
        StopAll(children);
        return absl::UnavailableError(absl::StrCat(c.name, " stopped during start-up (see ", c.log, ")"));
      }
    }
    auto health = client->Health(absl::Seconds(1));
    if (health.ok() && health->status() == lamina::v1::HealthResponse::SERVING) break;
    std::string why = health.ok() ? health->detail()
                      : absl::IsUnavailable(health.status()) || absl::IsDeadlineExceeded(health.status())
                          ? "the coordinator is not answering yet"
                          : absl::StrCat("the coordinator refuses the health check: ", health.status().message());
    if (why != waiting_for) {
      std::fprintf(stderr, "lamina up: waiting: %s\n", why.c_str());
      waiting_for = why;
    }
    if (absl::Now() > deadline) {
      StopAll(children);
      return absl::DeadlineExceededError(absl::StrCat("the cluster was not healthy after ", timeout_s, " s: ", why));
    }
    if (int sig = WaitForSignal(absl::Milliseconds(200))) {
      StopAll(children);
      return absl::CancelledError(absl::StrCat("stopped by signal ", sig, " during start-up"));
    }
  }

  std::printf("Lamina is up: endpoint %s\n", topology.coordinator_address().c_str());
  std::printf("  model %s; %zu compute and %zu memory nodes; logs in %s\n",
              std::filesystem::path(topology.model_dir).filename().c_str(), topology.NodesOf(NodeKind::kCompute).size(),
              topology.NodesOf(NodeKind::kMemory).size(), log_dir.c_str());
  const bool tls = topology.coordinator_tls.enabled();
  std::printf("  try: lamina generate --%s %s --prompt \"In this paper, we\"\n", tls ? "topology" : "endpoint",
              tls ? topology_path.c_str() : topology.coordinator_address().c_str());
  if (topology.coordinator_http_port != 0) {
    std::printf("  OpenAI-compatible API: %s://%s/v1 (completions, chat/completions, models)\n", tls ? "https" : "http",
                topology.coordinator_http_address().c_str());
    std::printf("  metrics for Prometheus: http://%s/metrics\n", topology.coordinator_http_address().c_str());
  }
  std::printf("  Ctrl-C stops the cluster.\n");
  std::fflush(stdout);

  for (;;) {
    if (int sig = WaitForSignal(absl::Milliseconds(200))) {
      std::fprintf(stderr, "lamina up: %s: draining the cluster (up to %d s), then stopping it\n", strsignal(sig),
                   topology.shutdown_grace_s);
      break;
    }
    Reap(children, /*report=*/true);
    PlanRestarts(children);
    Restart(children);
  }
  // The coordinator drains first, its nodes serving the requests in flight; then the nodes stop.
  if (children.front().name == "coordinator") {
    StopOne(children, children.front(), absl::Seconds(topology.shutdown_grace_s + 10));
  }
  StopAll(children);
  std::fprintf(stderr, "lamina up: stopped\n");
  return absl::OkStatus();
}

}  // namespace

int RunUp(const std::vector<std::string>& args) {
  // Signals are taken with sigtimedwait; blocked before any thread or child exists.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  int exit_code = 1;
  absl::Status status = Up(args, &exit_code);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina up: %s\n", std::string(status.message()).c_str());
  // A usage mistake (not a topology problem, which already set exit_code) gets the usage.
  if (absl::IsInvalidArgument(status) && exit_code != 2) std::fprintf(stderr, "%s", kUpUsage);
  return absl::IsInvalidArgument(status) ? 2 : exit_code;
}

}  // namespace lamina::cli
