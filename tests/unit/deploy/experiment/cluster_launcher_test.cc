// LaunchedCluster::Launch (deploy/experiment/cluster_launcher.h) waits for a port of its topology
// that something else holds, then starts `lamina up`, or names the port once the wait is over.
// `lamina up` here is a program that exits at once, so a launch that got past the wait fails
// saying the cluster never served.
#include "deploy/experiment/cluster_launcher.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina::experiment {
namespace {

// A socket listening on a port the kernel picks; closed when destroyed.
class HeldPort {
 public:
  HeldPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(fd_, 1) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~HeldPort() { Release(); }
  int port() const { return port_; }
  void Release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  int port_ = 0;
};

// A port free now (the kernel's pick, released).
int FreePort() {
  HeldPort held;
  return held.port();
}

// The demo topology with memory-0's data port replaced by `port`, and its other fixed ports by free
// ones (another test's connections may have left one of the fixed ports in TIME_WAIT).
std::string TopologyWithDataPort(const testing::TempDir& dir, int port) {
  const std::string text = testing::ReadFileOrDie(LAMINA_SOURCE_DIR "/deploy/topologies/local-cpu.yaml");
  std::vector<std::pair<std::string, std::string>> replacements = {
      {"model: ../models/", "model: " LAMINA_SOURCE_DIR "/deploy/models/"},
      {"data_port: 50172", "data_port: " + std::to_string(port)}};
  for (const char* fixed : {"50150", "50151", "50161", "50171", "50181", "50182"}) {
    replacements.push_back({fixed, std::to_string(FreePort())});
  }
  return dir.Write("topology.yaml", absl::StrReplaceAll(text, replacements));
}

TEST(ClusterLauncherTest, APortHeldThroughTheWaitIsNamed) {
  testing::TempDir dir;
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  const std::string topology = TopologyWithDataPort(dir, held.port());
  const absl::Time start = absl::Now();
  auto cluster = LaunchedCluster::Launch("/bin/true", topology, dir.path() + "/up.log", absl::Seconds(2));
  const absl::Duration waited = absl::Now() - start;
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(cluster.status().message().find("nodes 'memory-0' data_port: port " + std::to_string(held.port()) +
                                            " is already in use"),
            std::string::npos)
      << cluster.status();
  EXPECT_NE(cluster.status().message().find("(still, after "), std::string::npos) << cluster.status();
  EXPECT_GE(waited, absl::Seconds(1)) << "the port is waited for";
  EXPECT_LT(waited, absl::Seconds(10)) << "within the launch's timeout";
}

TEST(ClusterLauncherTest, APortFreedDuringTheWaitLetsTheLaunchGoOn) {
  testing::TempDir dir;
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  const std::string topology = TopologyWithDataPort(dir, held.port());
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(800));
    held.Release();
  });
  auto cluster = LaunchedCluster::Launch("/bin/true", topology, dir.path() + "/up.log", absl::Seconds(20));
  release.join();
  ASSERT_FALSE(cluster.ok());
  EXPECT_NE(cluster.status().message().find("exited before the cluster served"), std::string::npos)
      << "`lamina up` (here /bin/true) ran once the port was free: " << cluster.status();
}

}  // namespace
}  // namespace lamina::experiment
