// The nccl link (device_link.h) with both ends in this process: the compute end on GPU 0, the
// memory end on GPU 1. A step's picked batch rows reach the memory end packed, its outputs come
// back into the same batch rows and nowhere else; a memory end on the compute end's own GPU is
// refused with a reason. Skips without the GPUs each test needs.
#include <cuda_runtime_api.h>

#include <memory>
#include <utility>
#include <vector>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "data_plane/device_link.h"
#include "gtest/gtest.h"
#include "tests/support/cuda_test_util.h"

namespace lamina {
namespace {

using testing::DownloadFrom;
using testing::UploadTo;

int GpuCount() {
  int gpus = 0;
  return cudaGetDeviceCount(&gpus) == cudaSuccess ? gpus : 0;
}

TEST(NcclLinkTest, PickedRowsTravelPackedAndOutputsReturnToTheirRows) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs two GPUs: " << reason;
  if (GpuCount() < 2) GTEST_SKIP() << "needs two GPUs: this machine has " << GpuCount();
  // q 4, k 2, v 2 floats per row; 2 layers; the batch has 3 rows and rows 2 and 0 go to this node.
  const LinkShape shape{2, 8, 4, 4, 1, absl::Seconds(10)};
  const int64_t batch = 3, stride = 9, out_stride = 5;
  const std::vector<int32_t> rows = {2, 0};
  auto compute = CreateComputeLinkEnd("nccl", shape, 0);
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_EQ((*compute)->max_chunks(), 1);
  auto memory = CreateMemoryLinkEnd("nccl", shape, 1, (*compute)->Offer());
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_TRUE((*compute)->Accept(memory->second).ok());
  MemoryLinkEnd& far = *memory->first;

  std::vector<float> qkv(batch * stride);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i) + 0.5f;
  auto d_qkv = UploadTo(0, qkv);
  auto d_out = UploadTo(0, std::vector<float>(batch * out_stride, -1.f));
  cudaSetDevice(0);
  auto compute_stream = cuda::Stream::Create();
  cudaSetDevice(1);
  auto memory_stream = cuda::Stream::Create();
  auto d_attention = UploadTo(1, std::vector<float>(shape.max_rows * shape.q_size, 0.f));
  ASSERT_TRUE(compute_stream.ok() && memory_stream.ok());

  ASSERT_TRUE((*compute)->SetRows(rows).ok());
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    // The memory end's "attention": the received q rows, each plus 100 * (layer + 1).
    ASSERT_TRUE(far.QueueReceive(7, layer, 0, 1, 2, memory_stream->get()).ok());
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaMemcpy2DAsync(d_attention.data(), shape.q_size * sizeof(float), far.received(),
                                shape.qkv_size * sizeof(float), shape.q_size * sizeof(float), 2,
                                cudaMemcpyDeviceToDevice, memory_stream->get()),
              cudaSuccess);
    ASSERT_TRUE(far.QueueSend(7, layer, 0, 1, 2, d_attention.as<float>(), shape.q_size, memory_stream->get()).ok());
    ASSERT_TRUE((*compute)->QueueSend(7, layer, 0, 1, d_qkv.as<float>(), stride, compute_stream->get()).ok());
    ASSERT_TRUE(
        (*compute)->QueueReceive(7, layer, 0, 1, d_out.as<float>(), out_stride, compute_stream->get()).ok());
  }
  ASSERT_TRUE(compute_stream->Synchronize().ok());
  ASSERT_TRUE(memory_stream->Synchronize().ok());
  EXPECT_TRUE((*compute)->TakeStepStatus().ok());
  EXPECT_TRUE(far.TakeStepStatus().ok());

  const std::vector<float> received = DownloadFrom<float>(1, far.received(), 2 * shape.qkv_size);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t c = 0; c < shape.qkv_size; ++c) {
      ASSERT_EQ(received[i * shape.qkv_size + c], qkv[rows[i] * stride + c]) << i << "," << c;
    }
  }
  const std::vector<float> out = DownloadFrom<float>(0, d_out.data(), batch * out_stride);
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t c = 0; c < out_stride; ++c) {
      const bool written = r != 1 && c < shape.q_size;
      ASSERT_EQ(out[r * out_stride + c], written ? qkv[r * stride + c] : -1.f) << r << "," << c;
    }
  }
}

TEST(NcclLinkTest, BothEndsOnOneGpuAreRefused) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const LinkShape shape{1, 8, 4, 4, 1, absl::Seconds(1)};
  auto compute = CreateComputeLinkEnd("nccl", shape, 0);
  ASSERT_TRUE(compute.ok()) << compute.status();
  auto memory = CreateMemoryLinkEnd("nccl", shape, 0, (*compute)->Offer());
  ASSERT_TRUE(absl::IsFailedPrecondition(memory.status())) << memory.status();
  EXPECT_NE(memory.status().message().find("share GPU 0"), absl::string_view::npos) << memory.status();
}

TEST(NcclLinkTest, AGarbledOfferIsRefused) {
  const LinkShape shape{1, 8, 4, 4, 1, absl::Seconds(1)};
  auto memory = CreateMemoryLinkEnd("nccl", shape, 0, "garbage");
  EXPECT_FALSE(memory.ok());
}

}  // namespace
}  // namespace lamina
