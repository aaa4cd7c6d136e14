#include "data_plane/device_link.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

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

namespace {

using MemoryEnd = std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>;

// A device-side transport: how to open each end, or why this build has none.
struct LinkFactory {
  const char* name;
  absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> (*compute_end)(const LinkShape&, int);
  absl::StatusOr<MemoryEnd> (*memory_end)(const LinkShape&, int, const std::string&);
  const char* missing;  // when the ends are null: what the build lacks
};

constexpr LinkFactory kFactories[] = {
#if LAMINA_HAVE_CUDA
    {"cuda_ipc", CreateCudaIpcComputeEnd, CreateCudaIpcMemoryEnd, nullptr},
#else
    {"cuda_ipc", nullptr, nullptr, "this build has no CUDA"},
#endif
#if LAMINA_HAVE_NCCL
    {"nccl", CreateNcclComputeEnd, CreateNcclMemoryEnd, nullptr},
#else
    {"nccl", nullptr, nullptr, "this build has no NCCL"},
#endif
#if LAMINA_HAVE_RDMA
    {"rdma", CreateRdmaComputeEnd, CreateRdmaMemoryEnd, nullptr},
#else
    {"rdma", nullptr, nullptr, "this build has no libibverbs or no CUDA"},
#endif
};

// The factory of `transport`: InvalidArgument for a name that is no device-side transport,
// FailedPrecondition naming what this build lacks for one it was built without.
absl::StatusOr<const LinkFactory*> FactoryOf(const std::string& transport) {
  for (const LinkFactory& factory : kFactories) {
    if (transport != factory.name) continue;
    if (factory.missing != nullptr) return absl::FailedPreconditionError(absl::StrCat(transport, ": ", factory.missing));
    return &factory;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", transport, "' is not a device-side transport"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> CreateComputeLinkEnd(const std::string& transport,
                                                                     const LinkShape& shape, int device) {
  LAMINA_ASSIGN_OR_RETURN(const LinkFactory* factory, FactoryOf(transport));
  return factory->compute_end(shape, device);
}

absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateMemoryLinkEnd(
    const std::string& transport, const LinkShape& shape, int device, const std::string& offer) {
  LAMINA_ASSIGN_OR_RETURN(const LinkFactory* factory, FactoryOf(transport));
  absl::StatusOr<MemoryEnd> end = factory->memory_end(shape, device, offer);
  // The wire reader's "message too short" says neither whose message nor which.
  if (absl::IsDataLoss(end.status())) {
    return absl::DataLossError(
        absl::StrCat(transport, ": the compute end's offer cannot be read (", end.status().message(), ")"));
  }
  return end;
}

}  // namespace lamina
