// Starts a real cluster for a test: writes a topology with free ports into a temporary folder,
// runs `lamina up` on it (separate processes on loopback) and stops it when the harness dies.
#ifndef LAMINA_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
#define LAMINA_TESTS_INTEGRATION_CLUSTER_HARNESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "deploy/client/cluster_client.h"
#include "tests/support/temp_dir.h"

namespace lamina::testing {

struct ClusterOptions {
  std::string model = "lamina-demo-6m";  // a name under tests/data or deploy/models, or a folder
  int memory_nodes = 2;
  int64_t kv_capacity_tokens = 8192;
  int max_batch = 64;
  bool prefix_caching = true;
  std::string device = "cpu";  // of every node, e.g. "cuda:0"
  // Memory node i's device when given (else `device`), and the memory nodes' `transport`.
  std::vector<std::string> memory_devices;
  std::vector<std::string> compute_devices;  // compute node i's device when given (else `device`)
  std::string transport;
  std::string kv_dtype;                        // set: the memory nodes' `kv_dtype`
  std::optional<int64_t> random_weights_seed;  // set: `weights: random` with this seed
  std::string pipelining = "none";             // the topology's `pipelining`
  int rotational_above = 128;                  // and its `scheduler.rotational_above`
  bool stagger = false;                        // and its `scheduler.stagger`
  int max_tokens_per_iteration = 4096;         // and its `scheduler.max_tokens_per_iteration`
  bool chunked_prefill = true;                 // and its `scheduler.chunked_prefill`
  int compute_nodes = 1;
  int tensor_parallel = 1;  // each compute node's `tensor_parallel`
  // Set: compute node i's `layers: [first, end)` (a layer split), one pair per compute node.
  std::vector<std::pair<int64_t, int64_t>> layers;
  int64_t compute_kv_capacity_tokens = 0;  // > 0: each compute node's own pool (local attention)
  std::string placement;                   // set: the topology's `scheduler.placement`
  std::optional<int64_t> chunk_rows;  // set: the compute nodes' `chunk_rows`
  std::optional<int64_t> line_rows;   // set: the compute nodes' `line_rows`
  bool http = false;                  // the coordinator serves OpenAI's HTTP API (`http_port`)
  std::optional<int> max_migrations;  // set: the topology's `scheduler.max_migrations`
  std::string api_key;         // set: the coordinator's only API key (a key file); the harness's client uses it
  bool open_probes = true;     // and its `open_probes`
  std::string cluster_secret;  // set: the cluster secret (a file the topology names)
  std::optional<int> shutdown_grace_s;  // set: its `scheduler.shutdown_grace_s`
  bool tls = false;  // the coordinator's APIs over TLS, with a self-signed certificate; the client trusts it
};

class ClusterHarness {
 public:
  // Starts the cluster and waits (up to a minute) until `lamina up` reports it healthy.
  static absl::StatusOr<std::unique_ptr<ClusterHarness>> Start(const ClusterOptions& options);
  ~ClusterHarness();  // SIGTERM to `lamina up`, which stops every daemon

  const std::string& endpoint() const { return endpoint_; }
  // host:port of OpenAI's HTTP API (ClusterOptions::http), else empty.
  const std::string& http_address() const { return http_address_; }
  cli::ClusterClient& client() { return *client_; }
  // The pid of a node, from `lamina status`.
  absl::StatusOr<int64_t> NodePid(const std::string& node);
  // ClusterOptions::tls: the coordinator's certificate, what clients trust; else empty.
  const std::string& tls_ca() const { return tls_ca_; }
  // The topology file the cluster was started from.
  const std::string& topology_path() const { return topology_path_; }
  // The pid of this cluster's coordinator process (found by its command line).
  absl::StatusOr<pid_t> CoordinatorPid() const;
  // Sends `signal` to `lamina up` itself.
  void SignalUp(int signal) const;
  // Waits up to `most` for `lamina up` to exit; its exit status, or DeadlineExceeded.
  absl::StatusOr<int> WaitForUp(absl::Duration most);
  // What `lamina up` printed so far (stdout and stderr).
  std::string UpOutput() const;
  // What node `name` wrote to its log.
  std::string NodeLog(const std::string& name) const;

 private:
  static std::string ReadText(const std::string& path);  // "" when unreadable
  static absl::StatusOr<std::unique_ptr<ClusterHarness>> StartOnce(const ClusterOptions& options);
  ClusterHarness() = default;

  TempDir dir_;
  std::string topology_path_;
  std::string endpoint_;
  std::string http_address_;
  std::string tls_ca_;
  pid_t up_pid_ = -1;
  std::unique_ptr<cli::ClusterClient> client_;
};

// A port nobody listens on now, outside deploy/topologies' band of fixed ports (50000-50999).
int FreePort();
// Runs the `lamina` CLI with `args`; returns its exit code and its stdout+stderr.
std::pair<int, std::string> RunCli(const std::string& args);

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
