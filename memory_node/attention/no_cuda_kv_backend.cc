// Builds without CUDA: a GPU memory node is refused with the reason.
#include "absl/strings/str_cat.h"
#include "memory_node/attention/kv_backend.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<KvBackend>> CreateCudaKvBackend(const KvBackendOptions& options, int device) {
  return absl::FailedPreconditionError(
      absl::StrCat("device cuda:", device, ": this build of Lamina has no CUDA support (rebuild with the CUDA toolkit)"));
}

}  // namespace lamina
