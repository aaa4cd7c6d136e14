#include "deploy/experiment/cluster_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status/status_macros.h"
#include "common/topology/topology.h"
#include "deploy/cli/cluster_client.h"

namespace lamina::experiment {
namespace {

std::string Tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t from = all.size() > lines ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n  ");
}

}  // namespace

absl::StatusOr<std::unique_ptr<LaunchedCluster>> LaunchedCluster::Launch(const std::string& lamina_binary,
                                                                        const std::string& topology_file,
                                                                        const std::string& log_file,
                                                                        absl::Duration timeout) {
  LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(topology_file));
  const int log = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot write ", log_file, ": ", std::strerror(errno)));
  std::fflush(nullptr);  // the child must not repeat our buffered output
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // Ctrl-C reaches us; we stop the cluster in order
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    std::vector<std::string> args = {lamina_binary, "up", topology_file};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(log);
  std::unique_ptr<LaunchedCluster> cluster(new LaunchedCluster(pid, topology.coordinator_address()));

  cli::ClusterClient client(cluster->endpoint());
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      cluster->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("`lamina up ", topology_file, "` exited before the cluster served; ",
                                                 log_file, ":\n  ", Tail(log_file, 8)));
    }
    absl::StatusOr<lamina::v1::HealthResponse> health = client.Health(absl::Milliseconds(500));
    if (health.ok() && health->status() == lamina::v1::HealthResponse::SERVING) return cluster;
    if (absl::Now() > deadline) {
      return absl::UnavailableError(absl::StrCat("the cluster of ", topology_file, " was not serving after ",
                                                 absl::FormatDuration(timeout), "; ", log_file, ":\n  ",
                                                 Tail(log_file, 8)));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
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
