// The rdma data plane without a NIC (CI, and our GPU machines): endpoints survive the wire, and a
// machine without an RDMA device refuses the queue pair and the link with a reason, so that a
// compute node falls back to the next transport. With a device, these skip and the hardware tests
// (rdma_hardware_test, label `rdma`) run instead.
#include "common/rdma/queue_pair.h"

#include <infiniband/verbs.h>

#include <vector>

#include "data_plane/device_link.h"
#include "gtest/gtest.h"

namespace lamina::rdma {
namespace {

bool HasRdmaDevice() {
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices != nullptr) ibv_free_device_list(devices);
  return count > 0;
}

TEST(RdmaWireTest, EndpointsAndBuffersSurviveTheWire) {
  Endpoint e;
  e.qpn = 0x123456;
  e.psn = 0xabcdef;
  e.lid = 17;
  e.port = 2;
  for (int i = 0; i < 16; ++i) e.gid[i] = static_cast<uint8_t>(i * 7);
  e.gid_index = 3;
  e.mtu = 5;
  const RemoteBuffer b{0x7f0000001000, 0x55aa, 1 << 21};
  std::vector<uint8_t> bytes;
  WireWriter w(&bytes);
  e.Put(&w);
  b.Put(&w);

  WireReader r(bytes.data(), bytes.size());
  Endpoint e2;
  RemoteBuffer b2;
  ASSERT_TRUE(e2.Get(&r).ok());
  ASSERT_TRUE(b2.Get(&r).ok());
  EXPECT_EQ(e2.qpn, e.qpn);
  EXPECT_EQ(e2.psn, e.psn);
  EXPECT_EQ(e2.lid, e.lid);
  EXPECT_EQ(e2.port, e.port);
  EXPECT_EQ(e2.gid, e.gid);
  EXPECT_EQ(e2.gid_index, e.gid_index);
  EXPECT_EQ(e2.mtu, e.mtu);
  EXPECT_EQ(b2.address, b.address);
  EXPECT_EQ(b2.rkey, b.rkey);
  EXPECT_EQ(b2.bytes, b.bytes);

  WireReader truncated(bytes.data(), 10);
  EXPECT_FALSE(Endpoint().Get(&truncated).ok());
}

TEST(RdmaNoDeviceTest, TheQueuePairAndTheLinkAreRefusedWithAReason) {
  if (HasRdmaDevice()) GTEST_SKIP() << "this machine has an RDMA device: rdma_hardware_test covers it";
  auto qp = QueuePair::Open("");
  ASSERT_TRUE(absl::IsFailedPrecondition(qp.status())) << qp.status();
  EXPECT_NE(qp.status().message().find("no RDMA device on this machine"), absl::string_view::npos) << qp.status();

  // The link fails the same way before it touches a GPU, so the compute node can try the next
  // transport in its list.
  const LinkShape shape{2, 8, 4, 16, 1, absl::Seconds(1)};
  auto compute = CreateComputeLinkEnd("rdma", shape, 0);
  ASSERT_TRUE(absl::IsFailedPrecondition(compute.status())) << compute.status();
  EXPECT_NE(compute.status().message().find("rdma: no RDMA device"), absl::string_view::npos) << compute.status();
  auto memory = CreateMemoryLinkEnd("rdma", shape, 0, "offer");
  ASSERT_TRUE(absl::IsFailedPrecondition(memory.status())) << memory.status();
}

}  // namespace
}  // namespace lamina::rdma
