// deploy/slurm/lamina.sbatch on a real single-machine Slurm, which the test starts (munged,
// slurmctld and slurmd on ports of its own, state in a temporary folder): the job serves the demo
// model, answers a request, and stops when cancelled. Needs root and Debian's slurmctld, slurmd
// and munge; skips without them.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/process/child_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/support/golden.h"
#include "tests/support/http_client.h"
#include "tests/support/temp_dir.h"

namespace lamina::testing {
namespace {

// Runs `command` in a shell with SLURM_CONF set; its output.
std::string Slurm(const std::string& conf, const std::string& command) {
  FILE* pipe = ::popen(("SLURM_CONF=" + conf + " " + command + " 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while (pipe != nullptr && (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  if (pipe != nullptr) ::pclose(pipe);
  return out;
}

// munged, slurmctld and slurmd for one node, "localhost", stopped when destroyed.
class LocalSlurm {
 public:
  explicit LocalSlurm(const TempDir& dir) : dir_(dir.path()) {
    for (const char* sub : {"/state", "/spool", "/munge"}) std::filesystem::create_directories(dir_ + sub);
    conf_ = dir_ + "/slurm.conf";
    std::ofstream(conf_) << absl::StrCat(
        "ClusterName=laminatest\nSlurmctldHost=localhost\nSlurmUser=root\nSlurmdUser=root\n",
        "SlurmctldPort=", FreePort(), "\nSlurmdPort=", FreePort(), "\n",
        "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=", dir_, "/munge/munge.socket\n",
        "MpiDefault=none\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n",
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\n",
        "StateSaveLocation=", dir_, "/state\nSlurmdSpoolDir=", dir_, "/spool\n",
        "SlurmctldPidFile=", dir_, "/slurmctld.pid\nSlurmdPidFile=", dir_, "/slurmd.pid\n",
        "JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n",
        "JobAcctGatherType=jobacct_gather/none\nKillWait=10\n",
        "NodeName=localhost NodeAddr=127.0.0.1 CPUs=", std::thread::hardware_concurrency(), " State=UNKNOWN\n",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
    Start({"/usr/sbin/munged", "--foreground", "--force", "--socket=" + dir_ + "/munge/munge.socket",
           "--pid-file=" + dir_ + "/munge/munged.pid", "--seed-file=" + dir_ + "/munge/seed"},
          "munged");
    absl::SleepFor(absl::Milliseconds(300));
    ::setenv("SLURM_CONF", conf_.c_str(), 1);
    Start({"/usr/sbin/slurmctld", "-D", "-f", conf_}, "slurmctld");
    absl::SleepFor(absl::Milliseconds(500));
    Start({"/usr/sbin/slurmd", "-D", "-f", conf_, "-N", "localhost"}, "slurmd");
  }
  ~LocalSlurm() {
    // Every job gone first (their step daemons report to slurmd and slurmctld), then the daemons,
    // each given 10 s for SIGTERM before SIGKILL.
    Slurm(conf_, "scancel --full --user=root");
    const absl::Time jobs_deadline = absl::Now() + absl::Seconds(30);
    while (!Slurm(conf_, "squeue -h").empty() && absl::Now() < jobs_deadline) absl::SleepFor(absl::Milliseconds(200));
    for (auto it = pids_.rbegin(); it != pids_.rend(); ++it) {
      ::kill(*it, SIGTERM);
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (::waitpid(*it, nullptr, WNOHANG) == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
      if (::kill(*it, 0) == 0) ::kill(*it, SIGKILL);
      ::waitpid(*it, nullptr, 0);
    }
    ::unsetenv("SLURM_CONF");
  }
  // Whether the node came up idle within `most`.
  bool AwaitIdle(absl::Duration most) const {
    const absl::Time deadline = absl::Now() + most;
    while (absl::Now() < deadline) {
      if (Slurm(conf_, "sinfo -h -o %t").find("idle") != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }
  const std::string& conf() const { return conf_; }
  std::string Logs() const {
    return ReadFileOrEmpty(dir_ + "/slurmctld.out") + ReadFileOrEmpty(dir_ + "/slurmd.out") + ReadFileOrEmpty(dir_ + "/munged.out");
  }

 private:
  void Start(const std::vector<std::string>& argv, const std::string& name) {
    absl::StatusOr<pid_t> pid = SpawnLogged(argv, dir_ + "/" + name + ".out");
    if (pid.ok()) pids_.push_back(*pid);
  }
  std::string dir_, conf_;
  std::vector<pid_t> pids_;
};

TEST(SlurmTest, TheSbatchScriptServesTheDemoModelUntilCancelled) {
  if (::geteuid() != 0) GTEST_SKIP() << "starting Slurm's daemons needs root";
  for (const char* program : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch"}) {
    if (::access(program, X_OK) != 0) GTEST_SKIP() << program << " is not installed (apt-get install slurmctld slurmd)";
  }
  TempDir dir;
  LocalSlurm slurm(dir);
  ASSERT_TRUE(slurm.AwaitIdle(absl::Seconds(30))) << slurm.Logs();

  const int port = FreePort(), http_port = FreePort();
  const std::string topology = dir.Write(
      "cluster.yaml", absl::StrCat("model: ", ModelDir("lamina-demo-6m"), "\ncoordinator:\n  port: ", port,
                                   "\n  http_port: ", http_port, "\nnodes:\n",
                                   "  - {name: compute-0, role: compute, port: ", FreePort(), ", device: cpu}\n",
                                   "  - {name: memory-0, role: memory, port: ", FreePort(), ", data_port: ",
                                   FreePort(), ", device: cpu, kv_capacity_tokens: 4096}\n"));
  const std::string script = std::string(LAMINA_SOURCE_DIR) + "/deploy/slurm/lamina.sbatch";
  const std::string submitted =
      Slurm(slurm.conf(), absl::StrCat("LAMINA=", LAMINA_BINARY, " LAMINA_WORK=", dir.path(), " sbatch --parsable ",
                                       "--nodes=1 --output=", dir.path(), "/job.out ", script, " ", topology));
  int64_t job = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(submitted), &job)) << submitted << slurm.Logs();

  const std::string output = dir.path() + "/job.out";
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (ReadFileOrEmpty(output).find("Lamina is up") == std::string::npos && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_NE(ReadFileOrEmpty(output).find("Lamina is up"), std::string::npos)
      << ReadFileOrEmpty(output) << Slurm(slurm.conf(), "squeue") << slurm.Logs();
  EXPECT_NE(ReadFileOrEmpty(output).find("localhost: coordinator, compute-0, memory-0"), std::string::npos) << ReadFileOrEmpty(output);

  const nlohmann::json body = {{"prompt", "In this paper, we"}, {"max_tokens", 12}, {"temperature", 0}};
  absl::StatusOr<HttpReply> reply =
      HttpCall(absl::StrCat("127.0.0.1:", http_port), "POST", "/v1/completions", body.dump());
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->status, 200) << reply->body;
  const std::string text = nlohmann::json::parse(reply->body)["choices"][0]["text"];
  const std::string golden = LoadGoldenJson("lamina-demo-6m")["prompts"][3]["greedy_text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text, golden.substr(0, text.size()));

  Slurm(slurm.conf(), absl::StrCat("scancel ", job));
  const absl::Time stop_deadline = absl::Now() + absl::Seconds(60);
  while (ReadFileOrEmpty(output).find("lamina up: stopped") == std::string::npos && absl::Now() < stop_deadline) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_NE(ReadFileOrEmpty(output).find("lamina up: stopped"), std::string::npos) << ReadFileOrEmpty(output);
}

}  // namespace
}  // namespace lamina::testing
