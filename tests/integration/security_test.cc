// A cluster as a stranger on its network meets it: without an API key no client call is served,
// and without the cluster secret no internal call or data-plane connection reads or changes
// anything (each attack here once broke a cluster: a forged registration stalled every request, a
// free on the data port failed those in flight, an idle Step stream held the compute node's runner).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/http/http_client.h"
#include "common/net/sockets.h"
#include "common/rpc/channel.h"
#include "common/security/tls_context.h"
#include "common/topology/topology.h"
#include "common/transport/transport.h"
#include "common/transport/wire.h"
#include "data_plane/attention_protocol.h"
#include "gtest/gtest.h"
#include "lamina/v1/cluster.grpc.pb.h"
#include "lamina/v1/node.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"

namespace lamina::testing {
namespace {

using json = nlohmann::json;
constexpr char kKey[] = "sk-lamina-test-key-4242";
constexpr char kSecret[] = "cluster-secret-of-this-test-0123456789";

lamina::v1::GenerateRequest Request(int max_tokens) {
  lamina::v1::GenerateRequest r;
  r.set_text("In this paper, we");
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

// POST or GET over HTTP with `key` ("": none); the status and body.
std::pair<int, std::string> Http(const ClusterHarness& cluster, const std::string& method, const std::string& path,
                                 const std::string& body, const std::string& key) {
  auto stream = HttpResponseStream::Open(cluster.http_address(), method, path, body,
                                         body.empty() ? "" : "application/json", absl::Now() + absl::Seconds(30),
                                         HttpClientOptions{key, nullptr});
  if (!stream.ok()) return {-1, std::string(stream.status().message())};
  auto all = (*stream)->ReadAll();
  return {(*stream)->status(), all.ok() ? *all : ""};
}

TEST(SecurityTest, ApiKeysGuardGrpcAndHttpAndProbesStayOpen) {
  ::unsetenv("LAMINA_API_KEY");
  ClusterOptions options;
  options.api_key = kKey;
  options.http = true;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  std::unique_ptr<cli::ClusterClient> anonymous = *cli::ClusterClient::Connect((*cluster)->endpoint(), {});
  std::unique_ptr<cli::ClusterClient> wrong = *cli::ClusterClient::Connect((*cluster)->endpoint(), {"sk-guess", {}});
  EXPECT_EQ(Generate(*anonymous, Request(4)).status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Generate(*wrong, Request(4)).status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->Status(absl::Seconds(2)).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Generate((*cluster)->client(), Request(4)).status.ok());

  const std::string body = json{{"prompt", "In this paper, we"}, {"max_tokens", 4}}.dump();
  auto [refused, refusal] = Http(**cluster, "POST", "/v1/completions", body, "");
  EXPECT_EQ(refused, 401);
  EXPECT_EQ(json::parse(refusal)["error"]["code"], "invalid_api_key") << refusal;
  EXPECT_EQ(Http(**cluster, "POST", "/v1/completions", body, "sk-guess").first, 401);
  EXPECT_EQ(Http(**cluster, "POST", "/v1/completions", body, kKey).first, 200);
  EXPECT_EQ(Http(**cluster, "GET", "/health", "", "").first, 200) << "probes are open by default";
  EXPECT_EQ(Http(**cluster, "GET", "/metrics", "", "").first, 200);
  EXPECT_EQ(anonymous->Health(absl::Seconds(2))->status(), lamina::v1::HealthResponse::SERVING);
  // The key never reaches the logs.
  EXPECT_EQ((*cluster)->NodeLog("coordinator").find(kKey), std::string::npos);
}

TEST(SecurityTest, ProbesMayNeedTheKeyToo) {
  ::unsetenv("LAMINA_API_KEY");
  ClusterOptions options;
  options.api_key = kKey;
  options.open_probes = false;
  options.http = true;
  auto cluster = ClusterHarness::Start(options);  // lamina up checks health with the file's key
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(Http(**cluster, "GET", "/health", "", "").first, 401);
  EXPECT_EQ(Http(**cluster, "GET", "/health", "", kKey).first, 200);
  std::unique_ptr<cli::ClusterClient> anonymous = *cli::ClusterClient::Connect((*cluster)->endpoint(), {});
  EXPECT_EQ(anonymous->Health(absl::Seconds(2)).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(SecurityTest, WithTlsTheApisSpeakNothingElse) {
  ::unsetenv("LAMINA_API_KEY");
  ::unsetenv("LAMINA_TLS_CA");
  ClusterOptions options;
  options.tls = true;
  options.http = true;
  options.api_key = kKey;
  auto cluster = ClusterHarness::Start(options);  // its nodes and `lamina up` trust the certificate
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // gRPC: the harness's client trusts the certificate; one in the clear or trusting another does
  // not get through.
  Outcome served = Generate((*cluster)->client(), Request(4));
  EXPECT_TRUE(served.status.ok()) << served.status;
  std::unique_ptr<cli::ClusterClient> plain = *cli::ClusterClient::Connect((*cluster)->endpoint(), {kKey, {}});
  EXPECT_FALSE(plain->Health(absl::Seconds(3)).ok());
  std::unique_ptr<cli::ClusterClient> system_roots =
      *cli::ClusterClient::Connect((*cluster)->endpoint(), {kKey, ClientTls{true, ""}});
  EXPECT_FALSE(system_roots->Health(absl::Seconds(3)).ok());

  // The CLI, given the topology, trusts its certificate; given only the endpoint it needs --tls-ca.
  auto [code, output] = RunCli(absl::StrCat("generate --topology ", (*cluster)->topology_path(), " --api-key ", kKey,
                                            " --prompt 'In this paper, we' --max-tokens 4"));
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find(served.text), std::string::npos) << output;
  auto [ca_code, ca_output] = RunCli(absl::StrCat("status --endpoint ", (*cluster)->endpoint(), " --api-key ", kKey,
                                                  " --tls-ca ", (*cluster)->tls_ca()));
  EXPECT_EQ(ca_code, 0) << ca_output;

  // HTTPS: served with the certificate trusted; plain HTTP gets nothing.
  const std::string body = json{{"prompt", "In this paper, we"}, {"max_tokens", 4}}.dump();
  HttpClientOptions https{kKey, *TlsContext::ForClient((*cluster)->tls_ca())};
  auto stream = HttpResponseStream::Open((*cluster)->http_address(), "POST", "/v1/completions", body,
                                         "application/json", absl::Now() + absl::Seconds(30), https);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status(), 200);
  EXPECT_EQ(json::parse(*(*stream)->ReadAll())["choices"][0]["text"], served.text);
  EXPECT_NE(Http(**cluster, "POST", "/v1/completions", body, kKey).first, 200);
}

TEST(SecurityTest, WithoutTheClusterSecretNothingInternalIsReadOrChanged) {
  ClusterOptions options;
  options.cluster_secret = kSecret;
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();  // its own nodes prove the secret
  absl::StatusOr<Topology> topology = LoadTopology((*cluster)->topology_path());
  ASSERT_TRUE(topology.ok()) << topology.status();
  const std::string expected_first = [&] {
    Outcome o = Generate((*cluster)->client(), Request(200));
    EXPECT_TRUE(o.status.ok()) << o.status;
    return o.text;
  }();

  // A long request in flight on the memory nodes while a stranger tries its hand.
  RequestsInFlight running((*cluster)->client(), {Request(200)});
  ASSERT_TRUE(running.AwaitTokens(5, absl::Seconds(30)));

  // Registering as a memory node with one slot (which once stalled every request).
  auto cluster_stub = lamina::v1::Cluster::NewStub(CreateControlChannel((*cluster)->endpoint()));
  lamina::v1::RegisterRequest forged;
  forged.set_name("memory-0");
  forged.set_role(lamina::v1::NODE_ROLE_MEMORY);
  forged.set_grpc_address(topology->Find("memory-0")->grpc_address());
  forged.set_kv_capacity_slots(1);
  grpc::ClientContext register_context;
  lamina::v1::RegisterResponse registered;
  EXPECT_EQ(cluster_stub->Register(&register_context, forged, &registered).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Freeing every sequence on a memory node, over gRPC and over its data port.
  auto memory_stub =
      lamina::v1::MemoryNode::NewStub(CreateControlChannel(topology->Find("memory-0")->grpc_address()));
  lamina::v1::FreeSequencesRequest free_all;
  for (int64_t seq = 0; seq < 100; ++seq) free_all.add_seq_ids(seq);
  grpc::ClientContext free_context;
  lamina::v1::FreeSequencesResponse freed;
  EXPECT_EQ(memory_stub->FreeSequences(&free_context, free_all, &freed).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Forking a live sequence (whose fork's decode once read another user's KV).
  lamina::v1::ForkSequenceRequest fork;
  fork.set_from_seq_id(0);
  fork.set_to_seq_id(1 << 20);
  fork.set_length(1);
  grpc::ClientContext fork_context;
  lamina::v1::ForkSequenceResponse forked;
  EXPECT_EQ(memory_stub->ForkSequence(&fork_context, fork, &forked).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  for (const NodeSpec* memory : topology->NodesOf(NodeKind::kMemory)) {
    auto connection = MakeTcpTransport()->Connect(memory->data_address(), absl::Now() + absl::Seconds(2));
    ASSERT_TRUE(connection.ok()) << connection.status();
    std::vector<uint8_t> payload;
    WireWriter w(&payload);
    w.Put<uint32_t>(100);
    for (int64_t seq = 0; seq < 100; ++seq) w.Put<int64_t>(seq);
    const ByteSpan part(payload);
    (*connection)->Send({attention_protocol::kFree, 0, 1}, {&part, 1}).IgnoreError();
    MessageHeader header;
    std::vector<uint8_t> reply;
    // Either the challenge comes back (and the free is never read), or the connection closes.
    const absl::Status read = (*connection)->Receive(&header, &reply, absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(!read.ok() || header.type != attention_protocol::kReply) << "a stranger's free was answered";
  }

  // A Step stream that would hold the compute node's only runner.
  auto compute_stub =
      lamina::v1::ComputeNode::NewStub(CreateControlChannel(topology->Find("compute-0")->grpc_address()));
  grpc::ClientContext step_context;
  auto step = compute_stub->Step(&step_context);
  lamina::v1::StepResult result;
  EXPECT_FALSE(step->Read(&result));
  EXPECT_EQ(step->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // None of it changed anything: the request in flight ends as it would have, and the cluster
  // serves on with memory-0 as it registered.
  const std::vector<Outcome> outcomes = running.Join();
  ASSERT_TRUE(outcomes[0].status.ok()) << outcomes[0].status;
  EXPECT_EQ(outcomes[0].text, expected_first);
  auto status = (*cluster)->client().Status(absl::Seconds(2));
  ASSERT_TRUE(status.ok()) << status.status();
  for (const auto& n : status->nodes()) {
    if (n.name() == "memory-0") {
      EXPECT_EQ(n.kv_capacity_slots(), 8192);
    }
  }
  EXPECT_TRUE(Generate((*cluster)->client(), Request(4)).status.ok());
}

// 10,000 connect-and-close cycles on a memory node's data port (once a leaked descriptor and
// thread each): its descriptors stay as they were.
TEST(SecurityTest, AMemoryNodesDescriptorsStayFlatOverTenThousandConnections) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<Topology> topology = LoadTopology((*cluster)->topology_path());
  ASSERT_TRUE(topology.ok());
  absl::StatusOr<int64_t> pid = (*cluster)->NodePid("memory-0");
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto descriptors = [&] {
    int64_t n = 0;
    for ([[maybe_unused]] const auto& entry :
         std::filesystem::directory_iterator(absl::StrCat("/proc/", *pid, "/fd"))) {
      ++n;
    }
    return n;
  };
  const int64_t before = descriptors();
  const std::string data = topology->Find("memory-0")->data_address();
  for (int i = 0; i < 10000; ++i) {
    absl::StatusOr<int> fd = ConnectTcp(data, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(fd.ok()) << i << ": " << fd.status();
    // Closed with a reset: 10,000 closes of ours would otherwise leave as many ports in TIME_WAIT,
    // among them fixed ports other tests bind.
    const linger reset{1, 0};
    ::setsockopt(*fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    ::close(*fd);
  }
  // Closed connections are reaped as the server notices them.
  int64_t after = descriptors();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (after > before + 8 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    after = descriptors();
  }
  EXPECT_LE(after, before + 8) << before << " descriptors before, " << after << " after";
  EXPECT_TRUE(Generate((*cluster)->client(), Request(4)).status.ok());
}

}  // namespace
}  // namespace lamina::testing
