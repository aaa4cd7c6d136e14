#include "tests/bench/hop_clock.h"

#include <cuda_runtime_api.h>

#include <limits>
#include <numeric>

#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"

namespace lamina::bench {

absl::StatusOr<HopClock> HopClock::Create(int64_t layers) {
  HopClock clock;
  clock.host_.resize(2 * layers);
  LAMINA_ASSIGN_OR_RETURN(clock.words_, cuda::DeviceBuffer::Create(clock.host_.size() * sizeof(uint64_t)));
  LAMINA_RETURN_IF_ERROR(clock.Reset());
  return clock;
}

absl::Status HopClock::Reset() {
  for (size_t i = 0; i < host_.size(); i += 2) {
    host_[i] = std::numeric_limits<uint64_t>::max();
    host_[i + 1] = 0;
  }
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(words_.data(), host_.data(), host_.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::StatusOr<std::pair<double, int64_t>> HopClock::Sum(int64_t first) {
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host_.data(), words_.data(), host_.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  double sum = 0;
  const int64_t layers = static_cast<int64_t>(host_.size() / 2);
  for (int64_t l = first; l < layers; ++l) {
    const uint64_t sent = host_[2 * l], back = host_[2 * l + 1];
    if (sent == std::numeric_limits<uint64_t>::max() || back < sent) return std::pair<double, int64_t>{0, 0};
    sum += static_cast<double>(back - sent);
    step_ns_ = std::gcd(step_ns_, back - sent);
  }
  return std::pair<double, int64_t>{sum, layers - first};
}

}  // namespace lamina::bench
