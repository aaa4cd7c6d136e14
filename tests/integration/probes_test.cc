// The standard gRPC services every daemon answers: grpc.health.v1.Health (what Kubernetes' gRPC
// probes call) and server reflection (what grpcurl-style tools call). Called here with raw
// protobuf bytes, as such tools would, without their generated stubs.
#include <signal.h>

#include <string>

#include "common/topology/topology.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace lamina::testing {
namespace {

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) return "";
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

// grpc.health.v1.Health/Check for every service: the response's bytes ("\x08\x01": SERVING,
// "\x08\x02": NOT_SERVING), or "error: ..." when the call fails.
std::string HealthCheck(const std::string& address) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::CompletionQueue queue;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", ToBuffer(""), &queue);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  queue.Next(&tag, &ok);
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  return status.ok() ? FromBuffer(response) : "error: " + status.error_message();
}

// Server reflection's list of services, as the raw response bytes (names appear as text).
std::string ReflectionServices(const std::string& address) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::CompletionQueue queue;
  auto call = stub.PrepareCall(&context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  void* tag;
  bool ok;
  auto step = [&](int id) { return queue.Next(&tag, &ok) && ok && tag == reinterpret_cast<void*>(id); };
  call->StartCall(reinterpret_cast<void*>(1));
  std::string out;
  if (step(1)) {
    call->Write(ToBuffer(std::string("\x3a\x00", 2)), reinterpret_cast<void*>(2));  // list_services: ""
    if (step(2)) {
      grpc::ByteBuffer response;
      call->Read(&response, reinterpret_cast<void*>(3));
      if (step(3)) out = FromBuffer(response);
    }
  }
  context.TryCancel();
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  return out;
}

TEST(ProbesTest, EveryDaemonAnswersTheStandardHealthAndReflectionServices) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<Topology> topology = LoadTopology((*cluster)->topology_path());
  ASSERT_TRUE(topology.ok());
  const std::string serving("\x08\x01", 2), not_serving("\x08\x02", 2);
  EXPECT_EQ(HealthCheck((*cluster)->endpoint()), serving);
  EXPECT_EQ(HealthCheck(topology->Find("memory-0")->grpc_address()), serving);
  EXPECT_EQ(HealthCheck(topology->Find("compute-0")->grpc_address()), serving);
  const std::string services = ReflectionServices((*cluster)->endpoint());
  EXPECT_NE(services.find("lamina.v1.Generation"), std::string::npos) << services;
  EXPECT_NE(services.find("grpc.health.v1.Health"), std::string::npos) << services;

  // With its only compute node hung, the coordinator cannot serve, and says so; then recovers.
  absl::StatusOr<int64_t> compute = (*cluster)->NodePid("compute-0");
  ASSERT_TRUE(compute.ok()) << compute.status();
  ::kill(static_cast<pid_t>(*compute), SIGSTOP);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (HealthCheck((*cluster)->endpoint()) != not_serving && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(HealthCheck((*cluster)->endpoint()), not_serving);
  ::kill(static_cast<pid_t>(*compute), SIGCONT);
  deadline = absl::Now() + absl::Seconds(10);
  while (HealthCheck((*cluster)->endpoint()) != serving && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(HealthCheck((*cluster)->endpoint()), serving);
}

}  // namespace
}  // namespace lamina::testing
