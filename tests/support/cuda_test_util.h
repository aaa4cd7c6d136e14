// Shared by the CUDA tests: host vectors to and from device memory (a copy that fails fails the
// test), and fixtures for tests of the data planes' kernels on GPU 0. Header-only; include it
// only from tests that link gtest and the CUDA kernels.
#ifndef LAMINA_TESTS_SUPPORT_CUDA_TEST_UTIL_H_
#define LAMINA_TESTS_SUPPORT_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/data_plane.h"

namespace lamina::testing {

// A device buffer holding `host` (at least one byte, so that an empty vector gives a valid buffer).
template <typename T>
::lamina::cuda::DeviceBuffer Upload(const std::vector<T>& host) {
  auto buffer = ::lamina::cuda::DeviceBuffer::Create(std::max<size_t>(1, host.size() * sizeof(T)));
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(cudaMemcpy(buffer->data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return std::move(*buffer);
}

// `n` values of device memory, once every stream of the device is done.
template <typename T>
std::vector<T> Download(const void* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

template <typename T>
std::vector<T> Download(const ::lamina::cuda::DeviceBuffer& buffer, size_t n) {
  return Download<T>(buffer.data(), n);
}

// Upload and Download on GPU `device`, which they make current.
template <typename T>
::lamina::cuda::DeviceBuffer UploadTo(int device, const std::vector<T>& host) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  return Upload(host);
}

template <typename T>
std::vector<T> DownloadFrom(int device, const void* memory, size_t n) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  return Download<T>(memory, n);
}

// `n` values of device memory as they are now, while work queued on non-blocking streams may
// still run (to see a flag raised partway through a step).
template <typename T>
std::vector<T> Peek(const void* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// GPU 0 with the data planes' kernels loaded, as a link loads them when it opens: a lazily loaded
// kernel's first launch could otherwise wait for a spinning wait to end. Skips without a GPU.
class DataPlaneGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_TRUE(::lamina::kernels::cuda::PreloadDataPlaneKernels().ok());
  }
};

// DataPlaneGpuTest with error_, a zeroed word of pinned host memory for the kernels' waits to set
// when they give up.
class ErrorWordGpuTest : public DataPlaneGpuTest {
 protected:
  void SetUp() override {
    DataPlaneGpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto error = ::lamina::cuda::PinnedBuffer::Create(sizeof(uint32_t));
    ASSERT_TRUE(error.ok()) << error.status();
    error_ = std::move(*error);
    *error_.as<uint32_t>() = 0;
  }

  ::lamina::cuda::PinnedBuffer error_;
};

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_SUPPORT_CUDA_TEST_UTIL_H_
