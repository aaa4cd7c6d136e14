// Builds without CUDA: a GPU memory node is refused with the reason.
#include "common/cuda/device.h"
#include "kv/attention/kv_backend.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<KvBackend>> CreateCudaKvBackend(const KvBackendOptions& options, int device) {
  return UseDevice({true, device});  // says this build has no CUDA
}

}  // namespace lamina
