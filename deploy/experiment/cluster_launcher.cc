#include "deploy/experiment/cluster_launcher.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/process/child_process.h"
#include "common/status/status_macros.h"
#include "common/topology/topology.h"
#include "deploy/client/cluster_client.h"

namespace lamina::experiment {
namespace {

// How long a launch waits for a port of its topology that something else holds. A topology's
// fixed ports lie in the range Linux hands out for outgoing connections and for servers bound to
// port 0, so another program may hold one for a while (a CI run's tests did, for the whole of an
// experiment's offloaded runs).
constexpr absl::Duration kMostPortWait = absl::Seconds(60);
constexpr absl::Duration kPortRetry = absl::Milliseconds(500);

// OK once every port of `topology` is free (CheckPortsFree), retried until `deadline`; then
// Unavailable naming the port still taken and how long it was waited for.
absl::Status AwaitPortsFree(const Topology& topology, absl::Time deadline) {
  const absl::Time start = absl::Now();
  for (;;) {
    absl::Status free = CheckPortsFree(topology);
    if (free.ok()) return free;
    if (absl::Now() + kPortRetry > deadline) {
      return absl::UnavailableError(
          absl::StrCat(free.message(), " (still, after ", absl::FormatDuration(absl::Now() - start), ")"));
    }
    absl::SleepFor(kPortRetry);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LaunchedCluster>> LaunchedCluster::Launch(const std::string& lamina_binary,
                                                                        const std::string& topology_file,
                                                                        const std::string& log_file,
                                                                        absl::Duration timeout) {
  LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(topology_file));
  const absl::Time deadline = absl::Now() + timeout;
  LAMINA_RETURN_IF_ERROR(AwaitPortsFree(topology, std::min(deadline, absl::Now() + kMostPortWait)));
  LAMINA_ASSIGN_OR_RETURN(const pid_t pid, SpawnLogged({lamina_binary, "up", topology_file}, log_file));
  cli::ClientAccess access;
  if (const char* key = std::getenv("LAMINA_API_KEY")) access.api_key = key;
  access.tls = topology.coordinator_tls.ForClients();
  std::unique_ptr<LaunchedCluster> cluster(new LaunchedCluster(pid, topology.coordinator_address(), access));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<cli::ClusterClient> client, cluster->Connect());
  for (;;) {
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      cluster->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("`lamina up ", topology_file, "` exited before the cluster served; ",
                                                 log_file, ":\n  ", TailOfFile(log_file, 8, "\n  ")));
    }
    absl::StatusOr<lamina::v1::HealthResponse> health = client->Health(absl::Milliseconds(500));
    if (health.ok() && health->status() == lamina::v1::HealthResponse::SERVING) return cluster;
    if (absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("the cluster of ", topology_file, " was not serving after ",
                                                 absl::FormatDuration(timeout), "; ", log_file, ":\n  ",
                                                 TailOfFile(log_file, 8, "\n  ")));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<std::unique_ptr<cli::ClusterClient>> LaunchedCluster::Connect() const {
  return cli::ClusterClient::Connect(endpoint_, access_);
}

LaunchedCluster::~LaunchedCluster() { Stop(); }

void LaunchedCluster::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);  // `lamina up` stops its daemons, then exits
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (;;) {
    int status;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_ || (done < 0 && errno == ECHILD)) break;
    if (absl::Now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  pid_ = -1;
}

}  // namespace lamina::experiment
