// A cluster across machines, each machine a network namespace of its own (a veth pair into a
// bridge, an address of its own), made by the test: `lamina up TOPOLOGY --host ADDR` on each
// starts that machine's processes, which reach the others at their addresses. Needs root (and
// `ip`); skips without them.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/process/child_process.h"
#include "deploy/client/cluster_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/requests_in_flight.h"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina::testing {
namespace {

bool Shell(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// Namespaces "<prefix>-1" ... "<prefix>-n" at 10.77.<net>.1 ... .n, joined by a bridge at
// 10.77.<net>.254 in this namespace; removed with everything in them when destroyed.
class Hosts {
 public:
  Hosts(int n, int net) : prefix_(absl::StrCat("lam", ::getpid() % 100000)), net_(net) {
    ok_ = Shell(absl::StrCat("ip link add ", Bridge(), " type bridge")) &&
          Shell(absl::StrCat("ip link set ", Bridge(), " up")) &&
          Shell(absl::StrCat("ip addr add ", Address(254), "/24 dev ", Bridge()));
    for (int i = 1; ok_ && i <= n; ++i) {
      const std::string ns = Namespace(i), veth = absl::StrCat(prefix_, "v", i);
      ok_ = Shell("ip netns add " + ns) &&
            Shell(absl::StrCat("ip link add ", veth, " type veth peer name eth0 netns ", ns)) &&
            Shell(absl::StrCat("ip link set ", veth, " master ", Bridge(), " up")) &&
            Shell(absl::StrCat("ip netns exec ", ns, " ip addr add ", Address(i), "/24 dev eth0")) &&
            Shell(absl::StrCat("ip netns exec ", ns, " ip link set eth0 up")) &&
            Shell(absl::StrCat("ip netns exec ", ns, " ip link set lo up"));
      made_ = i;
    }
  }
  ~Hosts() {
    for (int i = 1; i <= made_; ++i) Shell("ip netns del " + Namespace(i));
    Shell("ip link del " + Bridge());
  }
  bool ok() const { return ok_; }
  std::string Namespace(int i) const { return absl::StrCat(prefix_, "-", i); }
  std::string Address(int i) const { return absl::StrCat("10.77.", net_, ".", i); }

 private:
  std::string Bridge() const { return prefix_ + "br"; }
  std::string prefix_;
  int net_;
  bool ok_ = false;
  int made_ = 0;
};

TEST(MultiHostTest, FourMachinesServeTheGoldenTextEachStartingItsOwnProcesses) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  if (!Shell("ip -V")) GTEST_SKIP() << "no `ip` command (iproute2)";
  Hosts hosts(4, 1);
  ASSERT_TRUE(hosts.ok()) << "could not make the network namespaces";

  TempDir dir;
  const std::string topology = dir.Write(
      "cluster.yaml", absl::StrCat("model: ", ModelDir("lamina-demo-6m"), "\n",
                                   "coordinator:\n  host: ", hosts.Address(1), "\n  port: 50151\n",
                                   "scheduler:\n  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 3000\n",
                                   "nodes:\n",
                                   "  - {name: compute-0, role: compute, host: ", hosts.Address(2),
                                   ", port: 50161, device: cpu}\n",
                                   "  - {name: memory-0, role: memory, host: ", hosts.Address(3),
                                   ", port: 50171, data_port: 50172, device: cpu, kv_capacity_tokens: 4096}\n",
                                   "  - {name: memory-1, role: memory, host: ", hosts.Address(4),
                                   ", port: 50171, data_port: 50172, device: cpu, kv_capacity_tokens: 4096}\n"));
  // Without --host, `lamina up` says the nodes are elsewhere and what to run.
  const std::string refused = dir.path() + "/refused.log";
  absl::StatusOr<pid_t> here = SpawnLogged({LAMINA_BINARY, "up", topology}, refused);
  ASSERT_TRUE(here.ok());
  int status = 0;
  ::waitpid(*here, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(ReadFileOrEmpty(refused).find("are on other machines: run `lamina up"), std::string::npos) << ReadFileOrEmpty(refused);

  std::vector<pid_t> ups;
  for (int i = 1; i <= 4; ++i) {
    absl::StatusOr<pid_t> pid = SpawnLogged(
        {"/usr/sbin/ip", "netns", "exec", hosts.Namespace(i), LAMINA_BINARY, "up", topology, "--host",
         hosts.Address(i), "--log-dir", absl::StrCat(dir.path(), "/logs-", i), "--timeout", "60"},
        absl::StrCat(dir.path(), "/up-", i, ".log"));
    ASSERT_TRUE(pid.ok()) << pid.status();
    ups.push_back(*pid);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadFileOrEmpty(dir.path() + "/up-1.log").find("Lamina is up") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  const std::string coordinator_up = ReadFileOrEmpty(dir.path() + "/up-1.log");
  ASSERT_NE(coordinator_up.find("Lamina is up"), std::string::npos)
      << coordinator_up << "\n" << ReadFileOrEmpty(dir.path() + "/up-2.log") << ReadFileOrEmpty(dir.path() + "/logs-2/compute-0.log");
  EXPECT_NE(coordinator_up.find("starting 1 processes on " + hosts.Address(1)), std::string::npos) << coordinator_up;

  // From this namespace (the bridge's address), a client reaches the coordinator's.
  absl::StatusOr<std::unique_ptr<cli::ClusterClient>> client =
      cli::ClusterClient::Connect(hosts.Address(1) + ":50151", {});
  ASSERT_TRUE(client.ok());
  const nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  std::vector<lamina::v1::GenerateRequest> requests(4);
  for (auto& r : requests) {
    r.set_text("In this paper, we");
    r.set_max_tokens(24);
  }
  const std::vector<Outcome> outcomes = GenerateConcurrently(**client, requests);
  const std::string want = golden["prompts"][3]["greedy_text"];
  for (const Outcome& o : outcomes) {
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_FALSE(o.text.empty());
    EXPECT_EQ(o.text, want.substr(0, o.text.size()));
  }
  absl::StatusOr<lamina::v1::ClusterStatusResponse> cluster = (*client)->Status(absl::Seconds(3));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  int64_t held = 0;
  for (const auto& n : cluster->nodes()) held += n.kv_capacity_slots();
  EXPECT_EQ(held, 8192) << "both memory nodes, on their own machines, registered";

  for (pid_t pid : ups) ::kill(pid, SIGTERM);
  for (pid_t pid : ups) ::waitpid(pid, &status, 0);
}

}  // namespace
}  // namespace lamina::testing
