// `lamina serve` as a user runs it: one command, a model folder, and an OpenAI-compatible server.
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/process/child_process.h"
#include "common/status/status_macros.h"
#include "common/topology/topology.h"
#include "deploy/client/cluster_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/support/golden.h"
#include "tests/support/http_client.h"
#include "tests/support/temp_dir.h"

namespace lamina::testing {
namespace {

// Starts `lamina serve` with `args` (its output to `log`) and waits until it is up: its pid, or an
// error with what it printed.
absl::StatusOr<pid_t> StartServe(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> command = {LAMINA_BINARY, "serve"};
  command.insert(command.end(), args.begin(), args.end());
  LAMINA_ASSIGN_OR_RETURN(const pid_t pid, SpawnLogged(command, log));
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadFileOrEmpty(log).find("Lamina is up") == std::string::npos) {
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) return absl::InternalError("lamina serve exited:\n" + ReadFileOrEmpty(log));
    if (absl::Now() > deadline) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, &status, 0);
      return absl::DeadlineExceededError("lamina serve did not come up in 60 s:\n" + ReadFileOrEmpty(log));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return pid;
}

TEST(ServeTest, OneCommandServesTheDemoModelOverOpenAisApiAndStopsOnSigterm) {
  TempDir dir;
  const int http_port = FreePort(), port = FreePort(), node_port = FreePort();
  const std::string log = dir.path() + "/serve.log", topology = dir.path() + "/served.yaml";
  absl::StatusOr<pid_t> pid =
      StartServe({"--model", ModelDir("lamina-demo-6m"), "--http-port", std::to_string(http_port), "--port",
                  std::to_string(port), "--node-port", std::to_string(node_port), "--write-topology", topology,
                  "--log-dir", dir.path() + "/logs"},
                 log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const std::string started = ReadFileOrEmpty(log);
  EXPECT_NE(started.find("a KV pool of 65536 tokens"), std::string::npos)
      << "64 full contexts of 1,024 tokens: all this machine's memory could hold that is of use\n"
      << started;

  // The topology it wrote is one compute node with its pool, and a valid start for a bigger one.
  absl::StatusOr<Topology> written = LoadTopology(topology);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->nodes.size(), 1u);

  const nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  const nlohmann::json body = {{"prompt", "In this paper, we"}, {"max_tokens", 16}, {"temperature", 0}};
  absl::StatusOr<HttpReply> reply =
      HttpCall(absl::StrCat("127.0.0.1:", http_port), "POST", "/v1/completions", body.dump());
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->status, 200) << reply->body;
  const std::string text = nlohmann::json::parse(reply->body)["choices"][0]["text"];
  EXPECT_EQ(text, golden["prompts"][3]["greedy_text"].get<std::string>().substr(0, text.size()));
  EXPECT_FALSE(text.empty());

  ::kill(*pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFileOrEmpty(log);
}

TEST(ServeTest, ACpuMemoryNodeTakesTheRequestsTheDevicesPoolCannotHold) {
  TempDir dir;
  const int http_port = FreePort(), port = FreePort(), node_port = FreePort(), memory_port = FreePort();
  const std::string log = dir.path() + "/serve.log";
  // The compute node's pool holds one context (1,024 tokens); 32 requests of about 60 need more.
  absl::StatusOr<pid_t> pid =
      StartServe({"--model", ModelDir("lamina-demo-6m"), "--http-port", std::to_string(http_port), "--port",
                  std::to_string(port), "--node-port", std::to_string(node_port), "--kv-tokens", "1024",
                  "--cpu-kv-tokens", "8192", "--memory-node-port", std::to_string(memory_port), "--log-dir",
                  dir.path() + "/logs"},
                 log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const std::string started = ReadFileOrEmpty(log);
  EXPECT_NE(started.find("a memory node on the CPUs with 8192 tokens"), std::string::npos) << started;

  const nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  const std::string expected = golden["prompts"][3]["greedy_text"].get<std::string>();
  const nlohmann::json body = {{"prompt", "In this paper, we"}, {"max_tokens", 48}, {"temperature", 0}};
  std::vector<std::string> texts(32);
  std::vector<std::thread> clients;
  for (std::string& text : texts) {
    clients.emplace_back([&] {
      absl::StatusOr<HttpReply> reply = HttpCall(absl::StrCat("127.0.0.1:", http_port), "POST", "/v1/completions",
                                                 body.dump(), absl::Seconds(60));
      if (reply.ok() && reply->status == 200) text = nlohmann::json::parse(reply->body)["choices"][0]["text"];
    });
  }
  for (std::thread& client : clients) client.join();
  for (const std::string& text : texts) {
    ASSERT_FALSE(text.empty()) << ReadFileOrEmpty(log);
    EXPECT_EQ(text, expected.substr(0, text.size()));
  }
  // The memory node attended some of them (its heartbeats, every 500 ms by default, report it).
  absl::StatusOr<std::unique_ptr<cli::ClusterClient>> client =
      cli::ClusterClient::Connect(absl::StrCat("127.0.0.1:", port), cli::ClientAccess{});
  ASSERT_TRUE(client.ok()) << client.status();
  int64_t attended = 0;
  for (const absl::Time until = absl::Now() + absl::Seconds(5); attended == 0 && absl::Now() < until;) {
    absl::StatusOr<lamina::v1::ClusterStatusResponse> status = (*client)->Status(absl::Seconds(1));
    ASSERT_TRUE(status.ok()) << status.status();
    for (const auto& node : status->nodes()) {
      if (node.name() == "memory-0") attended = node.load().attended_rows();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GT(attended, 0) << "the memory node never attended a row";
  ::kill(*pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFileOrEmpty(log);
}

TEST(ServeTest, AModelFolderThatIsNotOneIsNamed) {
  auto [code, out] = RunCli("serve --model /nonexistent/model");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("/nonexistent/model"), std::string::npos) << out;
  std::tie(code, out) = RunCli("serve");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--model DIR is required"), std::string::npos) << out;
}

}  // namespace
}  // namespace lamina::testing
