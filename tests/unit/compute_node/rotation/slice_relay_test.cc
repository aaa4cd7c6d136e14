// SliceRoute's placement, and SliceRelay's hand-overs between two replicas over the in-process
// transport: values arrive intact, leftovers of an abandoned step are skipped, a hand-over that
// never comes or does not match fails with a message naming the replica and the slice, a step
// abandoned by one replica ends the other's wait at once, and ends
// that cannot hand over GPU to GPU agree on host memory. (GPU to GPU hand-overs need two
// processes: GpuPipeliningTest runs them.)
#include "compute_node/rotation/slice_relay.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(SliceRouteTest, SliceKOfBatchJRunsOnReplicaJPlusKModR) {
  const SliceRoute batch1_on_0{1, 0, 2};
  EXPECT_FALSE(batch1_on_0.Owns(0));
  EXPECT_TRUE(batch1_on_0.Owns(1));
  EXPECT_FALSE(batch1_on_0.Owns(2));
  const SliceRoute batch2_of_3{2, 1, 3};
  EXPECT_EQ(batch2_of_3.OwnerOf(0), 2);
  EXPECT_EQ(batch2_of_3.OwnerOf(1), 0);
  EXPECT_EQ(batch2_of_3.OwnerOf(2), 1);
  EXPECT_TRUE(batch2_of_3.Owns(2));
  EXPECT_TRUE(batch2_of_3.Owns(5));
}

// Replica 0 hands batch 0's slices to replica 1 and back.
struct TwoReplicas {
  std::unique_ptr<Transport> transport = MakeInprocTransport();
  std::unique_ptr<ResidualInbox> inbox0, inbox1;
  std::unique_ptr<SliceRelay> relay0, relay1;

  explicit TwoReplicas(const std::string& name, absl::Duration timeout = absl::Seconds(5),
                       const DeviceHandoffs& device = {}) {
    inbox0 = *ResidualInbox::Start(transport.get(), name + "-0", device);
    inbox1 = *ResidualInbox::Start(transport.get(), name + "-1", device);
    relay0 = std::make_unique<SliceRelay>(transport.get(), inbox0.get(), SliceRoute{0, 0, 2},
                                          RelayPeers{"compute-0", "compute-1", name + "-1", "compute-1"}, timeout,
                                          device);
    relay1 = std::make_unique<SliceRelay>(transport.get(), inbox1.get(), SliceRoute{0, 1, 2},
                                          RelayPeers{"compute-1", "compute-0", name + "-0", "compute-0"}, timeout,
                                          device);
  }
  void Begin(uint64_t step) {
    relay0->BeginStep(step);
    relay1->BeginStep(step);
    relay0->BeginPass();
    relay1->BeginPass();
  }
};

TEST(SliceRelayTest, HandsTheResidualAndAttentionOutputToTheNextReplica) {
  TwoReplicas r("relay-values");
  r.Begin(7);
  const std::vector<float> residual = {1.5f, -2.0f, 3.25f, 0.0f, 9.0f, -0.5f};
  const std::vector<float> attn_out = {0.125f, 4.0f, -8.0f, 1.0f};
  ASSERT_TRUE(r.relay0->SendResidual(1, residual).ok());
  ASSERT_TRUE(r.relay0->SendAttnOut(1, attn_out).ok());
  std::vector<float> got_residual(6), got_attn_out(4);
  ASSERT_TRUE(r.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out)).ok());
  EXPECT_EQ(got_residual, residual);
  EXPECT_EQ(got_attn_out, attn_out);
  EXPECT_EQ(r.inbox1->SenderOf(0), "compute-0");
  // And on round the ring: slice 2 goes back to replica 0.
  const std::vector<float> back = {7.0f, 7.0f, 7.0f, 7.0f, 7.0f, 7.0f};
  ASSERT_TRUE(r.relay1->SendResidual(2, back).ok());
  ASSERT_TRUE(r.relay1->SendAttnOut(2, {back.data(), 4}).ok());
  ASSERT_TRUE(r.relay0->Receive(2, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out)).ok());
  EXPECT_EQ(got_residual, back);
}

// Replicas that ask for GPU hand-overs where they cannot open (no GPU here; on a GPU machine, CUDA
// IPC within one process) agree on host memory, and the hand-overs still arrive.
TEST(SliceRelayTest, WhereGpuHandOversCannotOpenBothEndsAgreeOnHostMemory) {
  const DeviceHandoffs device{0, {4, 6, 4, absl::Seconds(1)}, 1};
  TwoReplicas r("relay-no-gpu", absl::Seconds(5), device);
  r.Begin(9);
  EXPECT_FALSE(r.relay0->SendsOnDevice(1));
  EXPECT_FALSE(r.relay1->ReceivesOnDevice(1));
  const std::vector<float> residual = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(r.relay0->SendResidual(1, residual).ok());
  ASSERT_TRUE(r.relay0->SendAttnOut(1, {residual.data(), 4}).ok());
  std::vector<float> got_residual(6), got_attn_out(4);
  ASSERT_TRUE(r.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out)).ok());
  EXPECT_EQ(got_residual, residual);
  EXPECT_EQ(r.relay1->TakeDeviceStatus(), absl::OkStatus());
}

TEST(SliceRelayTest, SkipsHandOversLeftFromAnAbandonedStep) {
  TwoReplicas r("relay-stale");
  r.Begin(3);
  const std::vector<float> stale(6, -1.0f);
  ASSERT_TRUE(r.relay0->SendResidual(1, stale).ok());  // step 3 failed before its attention output
  r.Begin(4);
  const std::vector<float> fresh = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(r.relay0->SendResidual(1, fresh).ok());
  ASSERT_TRUE(r.relay0->SendAttnOut(1, {fresh.data(), 4}).ok());
  std::vector<float> got_residual(6), got_attn_out(4);
  ASSERT_TRUE(r.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out)).ok());
  EXPECT_EQ(got_residual, fresh);
  EXPECT_EQ(got_attn_out, std::vector<float>({1, 2, 3, 4}));
}

TEST(SliceRelayTest, AHandOverThatNeverComesFailsInTimeNamingTheReplica) {
  TwoReplicas r("relay-timeout", absl::Milliseconds(200));
  r.Begin(1);
  std::vector<float> residual(6), attn_out(4);
  const absl::Time start = absl::Now();
  const absl::Status status = r.relay1->Receive(1, absl::MakeSpan(residual), absl::MakeSpan(attn_out));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("compute node 'compute-0'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("slice 1"), std::string::npos) << status;
}

TEST(SliceRelayTest, AHandOverForAnotherSliceOrOfTheWrongSizeIsAnError) {
  TwoReplicas r("relay-mismatch");
  r.Begin(1);
  const std::vector<float> residual(6, 1.0f);
  ASSERT_TRUE(r.relay0->SendResidual(3, residual).ok());
  std::vector<float> got_residual(6), got_attn_out(4);
  absl::Status status = r.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("slice 3"), std::string::npos) << status;

  TwoReplicas sized("relay-size");
  sized.Begin(1);
  ASSERT_TRUE(sized.relay0->SendResidual(1, {residual.data(), 5}).ok());
  status = sized.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find("5 floats"), std::string::npos) << status;
}

// A step that fails on replica 0 (AbandonStep) ends replica 1's wait for its hand-over at once
// (within the half second it gives a closed connection's successor), not at the timeout, and the
// next step hands over both ways again, on fresh connections.
TEST(SliceRelayTest, AnAbandonedStepEndsTheNextReplicasWaitAtOnceAndTheNextStepHandsOverAgain) {
  TwoReplicas r("relay-abandon", absl::Seconds(20));
  r.Begin(5);
  r.relay0->AbandonStep();
  std::vector<float> got_residual(6), got_attn_out(4);
  const absl::Time start = absl::Now();
  const absl::Status waited = r.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_NE(waited.message().find("compute node 'compute-0'"), std::string::npos) << waited;

  r.Begin(6);
  const std::vector<float> residual = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(r.relay0->SendResidual(1, residual).ok());
  ASSERT_TRUE(r.relay0->SendAttnOut(1, {residual.data(), 4}).ok());
  ASSERT_TRUE(r.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out)).ok());
  EXPECT_EQ(got_residual, residual);
  const std::vector<float> back = {6, 5, 4, 3, 2, 1};
  ASSERT_TRUE(r.relay1->SendResidual(2, back).ok());
  ASSERT_TRUE(r.relay1->SendAttnOut(2, {back.data(), 4}).ok());
  ASSERT_TRUE(r.relay0->Receive(2, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out)).ok());
  EXPECT_EQ(got_residual, back);
  EXPECT_EQ(got_attn_out, std::vector<float>({6, 5, 4, 3}));
}

// Replica 1 never looked at the connection replica 0 closed when its step failed (it closed after
// replica 1's EndStep): at its next step replica 1 waits for replica 0's new connection rather
// than failing on the closed one.
TEST(SliceRelayTest, AConnectionClosedInAnEarlierStepIsPassedOverForItsSuccessor) {
  TwoReplicas r("relay-stale-close", absl::Seconds(20));
  r.Begin(5);
  r.relay0->AbandonStep();
  r.relay1->BeginStep(6);
  r.relay1->BeginPass();
  std::vector<float> got_residual(6), got_attn_out(4);
  absl::Status received;
  std::thread receiver([&] {
    received = r.relay1->Receive(1, absl::MakeSpan(got_residual), absl::MakeSpan(got_attn_out));
  });
  absl::SleepFor(absl::Milliseconds(100));  // the receive finds the closed one before replica 0 connects again
  r.relay0->BeginStep(6);
  r.relay0->BeginPass();
  const std::vector<float> residual = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(r.relay0->SendResidual(1, residual).ok());
  ASSERT_TRUE(r.relay0->SendAttnOut(1, {residual.data(), 4}).ok());
  receiver.join();
  ASSERT_TRUE(received.ok()) << received;
  EXPECT_EQ(got_residual, residual);
}

TEST(SliceRelayTest, AnUnreachableNextReplicaFailsTheSendNamingIt) {
  std::unique_ptr<Transport> transport = MakeInprocTransport();
  auto inbox = ResidualInbox::Start(transport.get(), "relay-lonely-0");
  ASSERT_TRUE(inbox.ok()) << inbox.status();
  SliceRelay relay(transport.get(), inbox->get(), SliceRoute{0, 0, 2},
                   RelayPeers{"compute-0", "compute-1", "relay-nobody-listens", "compute-1"}, absl::Milliseconds(200));
  relay.BeginStep(1);
  relay.BeginPass();
  const std::vector<float> residual(6, 1.0f);
  const absl::Status status = relay.SendResidual(1, residual);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("compute node 'compute-1'"), std::string::npos) << status;
}

}  // namespace
}  // namespace lamina
