#include "common/cuda/error_word.h"

#include <cuda_runtime_api.h>

#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"

namespace lamina::cuda {

absl::StatusOr<ErrorWord> ErrorWord::Create() {
  ErrorWord e;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&e.device_));
  LAMINA_ASSIGN_OR_RETURN(e.word_, DeviceBuffer::CreateZeroed(sizeof(uint32_t)));
  LAMINA_ASSIGN_OR_RETURN(e.staging_, PinnedBuffer::Create(sizeof(uint32_t)));
  LAMINA_ASSIGN_OR_RETURN(e.copies_, Stream::Create());
  return e;
}

absl::StatusOr<uint32_t> ErrorWord::Take() {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  uint32_t code = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&code, get(), sizeof(code), cudaMemcpyDeviceToHost, copies_.get()));
  LAMINA_RETURN_IF_ERROR(copies_.Synchronize());
  if (code == 0) return code;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(get(), 0, sizeof(uint32_t), copies_.get()));
  LAMINA_RETURN_IF_ERROR(copies_.Synchronize());
  return code;
}

absl::Status ErrorWord::Abort(uint32_t code) {
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  *staging_.as<uint32_t>() = code;
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(get(), staging_.data(), sizeof(uint32_t), cudaMemcpyHostToDevice, copies_.get()));
  return copies_.Synchronize();
}

}  // namespace lamina::cuda
