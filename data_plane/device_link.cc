#include "data_plane/device_link.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#if LAMINA_HAVE_CUDA
#include "data_plane/cuda_ipc_link.h"
#endif
#if LAMINA_HAVE_NCCL
#include "data_plane/nccl_link.h"
#endif
#if LAMINA_HAVE_RDMA
#include "data_plane/rdma_link.h"
#endif

namespace lamina {

int ChunksFor(int64_t rows, int max_chunks, int64_t chunk_rows) {
  if (chunk_rows < 1) return 1;
  return static_cast<int>(std::clamp<int64_t>(rows / chunk_rows, 1, std::max(1, max_chunks)));
}

absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> CreateComputeLinkEnd(const std::string& transport,
                                                                     const LinkShape& shape, int device) {
#if LAMINA_HAVE_CUDA
  if (transport == "cuda_ipc") return CreateCudaIpcComputeEnd(shape, device);
#else
  if (transport == "cuda_ipc") return absl::FailedPreconditionError("cuda_ipc: this build has no CUDA");
#endif
#if LAMINA_HAVE_NCCL
  if (transport == "nccl") return CreateNcclComputeEnd(shape, device);
#else
  if (transport == "nccl") return absl::FailedPreconditionError("nccl: this build has no NCCL");
#endif
#if LAMINA_HAVE_RDMA
  if (transport == "rdma") return CreateRdmaComputeEnd(shape, device);
#else
  if (transport == "rdma") return absl::FailedPreconditionError("rdma: this build has no libibverbs or no CUDA");
#endif
  return absl::InvalidArgumentError(absl::StrCat("'", transport, "' is not a device-side transport"));
}

namespace {

absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateMemoryEnd(const std::string& transport,
                                                                                     const LinkShape& shape,
                                                                                     int device,
                                                                                     const std::string& offer) {
#if LAMINA_HAVE_CUDA
  if (transport == "cuda_ipc") return CreateCudaIpcMemoryEnd(shape, device, offer);
#else
  if (transport == "cuda_ipc") return absl::FailedPreconditionError("cuda_ipc: this build has no CUDA");
#endif
#if LAMINA_HAVE_NCCL
  if (transport == "nccl") return CreateNcclMemoryEnd(shape, device, offer);
#else
  if (transport == "nccl") return absl::FailedPreconditionError("nccl: this build has no NCCL");
#endif
#if LAMINA_HAVE_RDMA
  if (transport == "rdma") return CreateRdmaMemoryEnd(shape, device, offer);
#else
  if (transport == "rdma") return absl::FailedPreconditionError("rdma: this build has no libibverbs or no CUDA");
#endif
  return absl::InvalidArgumentError(absl::StrCat("'", transport, "' is not a device-side transport"));
}

}  // namespace

absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateMemoryLinkEnd(
    const std::string& transport, const LinkShape& shape, int device, const std::string& offer) {
  auto end = CreateMemoryEnd(transport, shape, device, offer);
  // The wire reader's "message too short" says neither whose message nor which.
  if (absl::IsDataLoss(end.status())) {
    return absl::DataLossError(
        absl::StrCat(transport, ": the compute end's offer cannot be read (", end.status().message(), ")"));
  }
  return end;
}

}  // namespace lamina
