// Starts a cluster for an experiment run with `lamina up TOPOLOGY` as a child process (its output
// to a log file), waits until the cluster serves, and stops it (SIGTERM, then SIGKILL after a grace
// period) when destroyed. The child dies with this process (PR_SET_PDEATHSIG).
// Thread-compatible.
#ifndef LAMINA_DEPLOY_EXPERIMENT_CLUSTER_LAUNCHER_H_
#define LAMINA_DEPLOY_EXPERIMENT_CLUSTER_LAUNCHER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deploy/client/cluster_client.h"

namespace lamina::experiment {

class LaunchedCluster {
 public:
  // Unavailable when the cluster is not serving within `timeout` or `lamina up` exits (the message
  // ends with the tail of its log), or when a port of the topology stays taken by something else
  // (waited for up to a minute of `timeout` before `lamina up` starts).
  static absl::StatusOr<std::unique_ptr<LaunchedCluster>> Launch(const std::string& lamina_binary,
                                                                const std::string& topology_file,
                                                                const std::string& log_file, absl::Duration timeout);
  ~LaunchedCluster();  // Stop()
  LaunchedCluster(const LaunchedCluster&) = delete;
  LaunchedCluster& operator=(const LaunchedCluster&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  // A client of the cluster's API: LAMINA_API_KEY's key, and the topology's TLS.
  absl::StatusOr<std::unique_ptr<cli::ClusterClient>> Connect() const;
  void Stop();

 private:
  LaunchedCluster(pid_t pid, std::string endpoint, cli::ClientAccess access)
      : pid_(pid), endpoint_(std::move(endpoint)), access_(std::move(access)) {}

  pid_t pid_;
  std::string endpoint_;
  cli::ClientAccess access_;
};

}  // namespace lamina::experiment

#endif  // LAMINA_DEPLOY_EXPERIMENT_CLUSTER_LAUNCHER_H_
