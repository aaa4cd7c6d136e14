// Gemm::Prepare's promise (kernels/cuda/gemm.h): once a Gemm is prepared, its products run at any
// row count without cuBLASLt loading kernels, so they run while another kernel of the process
// spins on a flag, as a compute node's products run while its device links' waits spin. A load
// would wait for the spinning kernel to end. Its own test program, so that no other test has
// loaded cuBLASLt's kernels into the process first. Skips without a GPU.
#include "kernels/cuda/gemm.h"

#include <chrono>
#include <cstdint>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/data_plane.h"

namespace lamina::kernels::cuda {
namespace {

using ::lamina::cuda::DeviceBuffer;

DeviceBuffer Zeroed(size_t bytes) {
  auto buffer = DeviceBuffer::Create(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(cudaMemset(buffer->data(), 0, bytes), cudaSuccess);
  return *std::move(buffer);
}

TEST(GemmTest, PreparedProductsRunWhileAnotherKernelSpins) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_TRUE(PreloadDataPlaneKernels().ok());

  // Two of Llama-3.1-8B's products: the q/k/v projection (with a bias, as Qwen's) and the MLP's
  // down projection, which adds into the residual.
  const GemmShape qkv{6144, 4096, true, false}, down{4096, 14336, false, true};
  const int64_t max_rows = 4096;
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  ASSERT_TRUE((*gemm)->Prepare({qkv, down}, max_rows).ok());
  const int64_t queries = (*gemm)->algorithm_queries();
  EXPECT_GT((*gemm)->algorithms_run(), 0);
  EXPECT_LE((*gemm)->algorithms_run(), queries);

  DeviceBuffer x = Zeroed(max_rows * down.k * sizeof(bf16));
  DeviceBuffer w = Zeroed(down.n * down.k * sizeof(bf16));  // as large as qkv's
  DeviceBuffer bias = Zeroed(qkv.n * sizeof(float));
  DeviceBuffer out = Zeroed(max_rows * qkv.n * sizeof(float));
  DeviceBuffer flag = Zeroed(sizeof(uint64_t));
  auto error = ::lamina::cuda::PinnedBuffer::Create(sizeof(uint32_t));
  auto raise = ::lamina::cuda::PinnedBuffer::Create(sizeof(uint64_t));
  auto spinner = ::lamina::cuda::Stream::Create();
  auto worker = ::lamina::cuda::Stream::Create();
  ASSERT_TRUE(error.ok() && raise.ok() && spinner.ok() && worker.ok());
  *error->as<uint32_t>() = 0;
  *raise->as<uint64_t>() = 1;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Spins until the flag is raised below, or gives up after 6 s and sets the error word.
  ASSERT_TRUE(WaitFlagEquals(flag.as<uint64_t>(), 1, 6'000'000'000, error->as<uint32_t>(), 9, spinner->get()).ok());
  const auto start = std::chrono::steady_clock::now();
  for (const int64_t m : {3, 20, 100, 700, 3000, 4096}) {
    SCOPED_TRACE(m);
    ASSERT_TRUE((*gemm)->Run(x.as<bf16>(), w.as<bf16>(), bias.as<float>(), out.as<float>(), m, qkv.n, qkv.k, false,
                             worker->get()).ok());
    ASSERT_TRUE((*gemm)->Run(x.as<bf16>(), w.as<bf16>(), nullptr, out.as<float>(), m, down.n, down.k, true,
                             worker->get()).ok());
  }
  ASSERT_TRUE(worker->Synchronize().ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint32_t error_then = *error->as<uint32_t>();

  ASSERT_EQ(cudaMemcpyAsync(flag.data(), raise->data(), sizeof(uint64_t), cudaMemcpyHostToDevice, worker->get()),
            cudaSuccess);
  ASSERT_TRUE(spinner->Synchronize().ok());
  EXPECT_EQ(error_then, 0u) << "the products ended only after the spinning kernel gave up (" << seconds << " s)";
  EXPECT_LT(seconds, 3.0);
  EXPECT_EQ(*error->as<uint32_t>(), 0u) << "the flag raised after the products did not end the spin";
  EXPECT_EQ((*gemm)->algorithm_queries(), queries) << "cuBLASLt was asked again after Prepare";
}

}  // namespace
}  // namespace lamina::kernels::cuda
