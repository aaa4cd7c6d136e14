// The batch rows a compute end sends in a step, kept on its GPU for the gather and scatter
// kernels; shared by the device links (device_link.h) of every transport. Thread-compatible.
#ifndef LAMINA_DATA_PLANE_LINK_ROWS_H_
#define LAMINA_DATA_PLANE_LINK_ROWS_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/status/status_macros.h"

namespace lamina {

class LinkRows {
 public:
  LinkRows() = default;
  // Room for `max_rows` rows on GPU `device`; errors name `transport`.
  static absl::StatusOr<LinkRows> Create(const std::string& transport, int64_t max_rows, int device) {
    LinkRows r;
    r.transport_ = transport;
    r.max_rows_ = max_rows;
    r.device_ = device;
    LAMINA_ASSIGN_OR_RETURN(r.rows_, cuda::DeviceBuffer::Create(std::max<int64_t>(1, max_rows) * sizeof(int32_t)));
    return r;
  }

  // Uploads this step's rows (at most max_rows) and waits for the copy.
  absl::Status Set(absl::Span<const int32_t> rows) {
    if (static_cast<int64_t>(rows.size()) > max_rows_) {
      return absl::InvalidArgumentError(
          absl::StrCat(transport_, ": ", rows.size(), " rows for a link of ", max_rows_));
    }
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    count_ = static_cast<int64_t>(rows.size());
    LAMINA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(rows_.data(), rows.data(), rows.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }

  int64_t count() const { return count_; }
  const int32_t* device_rows() const { return rows_.as<int32_t>(); }  // int32 [count]

 private:
  std::string transport_;
  int64_t max_rows_ = 0;
  int device_ = 0;
  cuda::DeviceBuffer rows_;
  int64_t count_ = 0;
};

}  // namespace lamina

#endif  // LAMINA_DATA_PLANE_LINK_ROWS_H_
