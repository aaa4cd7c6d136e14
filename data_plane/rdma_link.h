// The rdma link (device_link.h has the contract), for device_link.cc to choose from.
#ifndef LAMINA_DATA_PLANE_RDMA_LINK_H_
#define LAMINA_DATA_PLANE_RDMA_LINK_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "data_plane/device_link.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<ComputeLinkEnd>> CreateRdmaComputeEnd(const LinkShape& shape, int device);
absl::StatusOr<std::pair<std::unique_ptr<MemoryLinkEnd>, std::string>> CreateRdmaMemoryEnd(
    const LinkShape& shape, int device, const std::string& offer);

}  // namespace lamina

#endif  // LAMINA_DATA_PLANE_RDMA_LINK_H_
