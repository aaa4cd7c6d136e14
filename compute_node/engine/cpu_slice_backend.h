// The model slices on the CPU kernels: ModelSlices with the batch state it works on.
// Thread-compatible.
#ifndef LAMINA_COMPUTE_NODE_ENGINE_CPU_SLICE_BACKEND_H_
#define LAMINA_COMPUTE_NODE_ENGINE_CPU_SLICE_BACKEND_H_

#include "compute_node/engine/model_slices.h"
#include "compute_node/engine/slice_backend.h"

namespace lamina {

class CpuSliceBackend : public SliceBackend {
 public:
  // `group`: the tensor-parallel group of a rank's weights (null: the whole model).
  CpuSliceBackend(const ModelWeights* weights, ThreadPool* pool, RankGroup* group = nullptr)
      : slices_(weights, pool, group), pool_(pool) {}

  const ModelConfig& config() const override { return slices_.config(); }
  QkvLayout qkv_layout() const override { return slices_.qkv_layout(); }
  absl::Status RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) override;
  absl::Status RunMiddle(int64_t slice) override;
  absl::Status RunLast(absl::Span<const int64_t> rows, Tensor* logits) override;
  absl::StatusOr<const float*> HostQkv() override { return state_.qkv.data(); }
  float* HostAttnOut() override { return state_.attn_out.data(); }
  absl::Status PrefillAttention(int64_t first_row, int64_t count) override;
  absl::Status ReadResidual(float* out) override;
  absl::Status ReadAttnOut(float* out) override;
  absl::Status ResumeAt(absl::Span<const int32_t> positions, const float* residual, const float* attn_out) override;

 private:
  ModelSlices slices_;
  ThreadPool* pool_;
  SliceState state_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_CPU_SLICE_BACKEND_H_
