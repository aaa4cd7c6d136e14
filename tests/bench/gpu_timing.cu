#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/graph.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/flags.cuh"
#include "tests/bench/gpu_timing.h"

namespace lamina::bench {
namespace {

// Sums 16-byte words, `kUnroll` independent loads in flight per thread.
template <int kUnroll>
__global__ void ReadKernel(const uint4* __restrict__ data, int64_t words, unsigned* __restrict__ sink) {
  unsigned acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < words; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads alive
}

__global__ void BusyWaitKernel(int64_t ns) {
  const uint64_t start = kernels::cuda::GlobalTimerNs();
  while (kernels::cuda::GlobalTimerNs() - start < static_cast<uint64_t>(ns)) {
  }
}

}  // namespace

absl::Status QueueBusyWait(int64_t ns, cudaStream_t stream) {
  BusyWaitKernel<<<1, 1, 0, stream>>>(ns);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::StatusOr<double> MedianMs(const std::function<absl::Status()>& work, cudaStream_t stream, int runs) {
  LAMINA_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create());
  LAMINA_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create());
  for (int i = 0; i < 3; ++i) LAMINA_RETURN_IF_ERROR(work());
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    LAMINA_RETURN_IF_ERROR(start.Record(stream));
    LAMINA_RETURN_IF_ERROR(work());
    LAMINA_RETURN_IF_ERROR(stop.Record(stream));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
    LAMINA_ASSIGN_OR_RETURN(float ms, stop.ElapsedSince(start));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

absl::StatusOr<double> GraphedMs(const std::function<absl::Status()>& work, cudaStream_t stream, int calls,
                                 int runs) {
  LAMINA_ASSIGN_OR_RETURN(const cuda::Graph graph, cuda::Graph::Capture(stream, [&]() -> absl::Status {
                            for (int i = 0; i < calls; ++i) LAMINA_RETURN_IF_ERROR(work());
                            return absl::OkStatus();
                          }));
  LAMINA_ASSIGN_OR_RETURN(const double ms, MedianMs([&] { return graph.Launch(stream); }, stream, runs));
  return ms / calls;
}

absl::StatusOr<double> BestReadRate(cudaStream_t stream) {
  const int64_t bytes = int64_t{2} << 30;
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer data, cuda::DeviceBuffer::Create(bytes));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer sink, cuda::DeviceBuffer::Create(sizeof(unsigned)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data.data(), 1, bytes, stream));
  int sms = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double best = 0;
  for (int blocks_per_sm : {2, 4, 8}) {
    for (int unroll : {4, 8}) {
      auto work = [&]() -> absl::Status {
        const int64_t words = bytes / 16;
        if (unroll == 4) {
          ReadKernel<4><<<sms * blocks_per_sm, 512, 0, stream>>>(data.as<uint4>(), words, sink.as<unsigned>());
        } else {
          ReadKernel<8><<<sms * blocks_per_sm, 512, 0, stream>>>(data.as<uint4>(), words, sink.as<unsigned>());
        }
        LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return absl::OkStatus();
      };
      LAMINA_ASSIGN_OR_RETURN(double ms, MedianMs(work, stream, 20));
      best = std::max(best, bytes / (ms * 1e-3));
    }
  }
  return best;
}

absl::StatusOr<double> ReportReadRate(cudaStream_t stream) {
  cudaDeviceProp prop;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  LAMINA_ASSIGN_OR_RETURN(double read_rate, BestReadRate(stream));
  std::printf("%s, %d SMs: best plain read rate in this run %.2f TB/s\n", prop.name, prop.multiProcessorCount,
              read_rate / 1e12);
  return read_rate;
}

int BenchMain(const char* program, int argc, char** argv,
              const std::function<absl::Status(const std::vector<std::string>&)>& run) {
  const absl::Status status = run(std::vector<std::string>(argv + 1, argv + argc));
  if (status.ok()) return 0;
  std::fprintf(stderr, "%s: %s\n", program, std::string(status.message()).c_str());
  return 1;
}

}  // namespace lamina::bench
