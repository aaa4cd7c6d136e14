// The rdma data plane on real hardware (label `rdma`; our GPU machines have no RDMA NIC, so this
// runs where one exists): two queue pairs on one device connected to each other, rows written from
// host memory into GPU memory registered for GPUDirect RDMA, then a flag written after them, and
// the whole link (compute end on GPU 0, memory end on the last GPU) carrying a step. Skips, saying
// why, without an RDMA device or a GPU.
#include <cuda_runtime_api.h>
#include <infiniband/verbs.h>

#include <vector>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "common/rdma/queue_pair.h"
#include "gtest/gtest.h"

namespace lamina::rdma {
namespace {

std::string SkipReason() {
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices != nullptr) ibv_free_device_list(devices);
  if (count == 0) return "needs an RDMA device: libibverbs lists none";
  const std::string gpu = NoGpuReason();
  return gpu.empty() ? "" : "needs a GPU: " + gpu;
}

TEST(RdmaHardwareTest, RowsThenTheirFlagLandInGpuMemory) {
  const std::string skip = SkipReason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  auto sender = QueuePair::Open("");
  auto receiver = QueuePair::Open("");
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  ASSERT_TRUE((*sender)->Connect((*receiver)->local()).ok());
  ASSERT_TRUE((*receiver)->Connect((*sender)->local()).ok());

  const size_t region = size_t{2} << 20;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto target = cuda::DeviceBuffer::Create(region);
  ASSERT_TRUE(target.ok());
  ASSERT_EQ(cudaMemset(target->data(), 0, region), cudaSuccess);
  auto target_mr = (*receiver)->RegisterGpu(target->data(), region);
  ASSERT_TRUE(target_mr.ok()) << target_mr.status();

  std::vector<float> rows(1000);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i) * 0.25f;
  uint64_t flag = 42;
  auto rows_mr = (*sender)->RegisterHost(rows.data(), rows.size() * sizeof(float));
  auto flag_mr = (*sender)->RegisterHost(&flag, sizeof(flag));
  ASSERT_TRUE(rows_mr.ok() && flag_mr.ok());
  const RemoteBuffer remote = target_mr->remote();
  ASSERT_TRUE((*sender)->Write(*rows_mr, rows.data(), rows.size() * sizeof(float), remote, 64, false).ok());
  ASSERT_TRUE((*sender)->Write(*flag_mr, &flag, sizeof(flag), remote, 0, true).ok());
  ASSERT_TRUE((*sender)->AwaitCompletion(absl::Seconds(5)).ok());

  std::vector<float> landed(rows.size());
  uint64_t landed_flag = 0;
  ASSERT_EQ(cudaMemcpy(&landed_flag, target->data(), sizeof(landed_flag), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(landed.data(), target->as<uint8_t>() + 64, rows.size() * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(landed_flag, 42u);
  EXPECT_EQ(landed, rows);
  // A write past the peer's region is refused before it is posted.
  EXPECT_TRUE(absl::IsInvalidArgument((*sender)->Write(*flag_mr, &flag, sizeof(flag), remote, region, true)));
}

}  // namespace
}  // namespace lamina::rdma
