// A step's error word: one uint32 in device memory that the step's GPU waits set when they give up
// and read as they spin (kernels/cuda/flags.cuh), so that once one wait has failed the rest pass at
// once. It lives on the GPU because every send reads it before raising its flag, and a read of host
// memory there would add a PCIe round trip to each hop.
//
// The host reads and clears it once the step's work is done (Take), and may set it while the waits
// spin (Abort: the peer they wait for is gone) with a copy on a stream of its own, which a copy
// engine runs beside the spinning kernels.
#ifndef LAMINA_COMMON_CUDA_ERROR_WORD_H_
#define LAMINA_COMMON_CUDA_ERROR_WORD_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace lamina::cuda {

class ErrorWord {
 public:
  ErrorWord() = default;
  // On the current device, zeroed.
  static absl::StatusOr<ErrorWord> Create();

  uint32_t* get() const { return word_.as<uint32_t>(); }
  // Host, once no work that reads or sets the word is queued or running: its code (0: none), and
  // the word cleared.
  absl::StatusOr<uint32_t> Take();
  // Host, any thread, while the waits may spin (not beside Take or another Abort): sets the word
  // to `code` and returns once it is set.
  absl::Status Abort(uint32_t code);

 private:
  int device_ = 0;
  DeviceBuffer word_;     // uint32
  PinnedBuffer staging_;  // uint32: the code Abort copies
  Stream copies_;
};

}  // namespace lamina::cuda

#endif  // LAMINA_COMMON_CUDA_ERROR_WORD_H_
