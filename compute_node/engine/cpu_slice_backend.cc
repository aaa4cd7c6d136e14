#include "compute_node/engine/cpu_slice_backend.h"

#include "kernels/cpu/attention.h"

namespace lamina {

absl::Status CpuSliceBackend::RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) {
  state_.positions.assign(positions.begin(), positions.end());
  slices_.RunFirst(tokens, &state_);
  return absl::OkStatus();
}

absl::Status CpuSliceBackend::RunMiddle(int64_t slice) {
  slices_.RunMiddle(slice, &state_);
  return absl::OkStatus();
}

absl::Status CpuSliceBackend::RunLast(absl::Span<const int64_t> rows, Tensor* logits) {
  slices_.RunLast(rows, &state_, logits);
  return absl::OkStatus();
}

absl::Status CpuSliceBackend::PrefillAttention(int64_t first_row, int64_t count) {
  const ModelConfig& c = config();
  const QkvLayout qkv = qkv_layout();
  const kernels::cpu::AttentionShape shape{c.num_q_heads, c.num_kv_heads, c.head_dim, c.sliding_window};
  const float* base = state_.qkv.row(first_row);
  kernels::cpu::PrefillAttention(shape, base + qkv.q_offset, qkv.row_stride, base + qkv.k_offset, base + qkv.v_offset,
                                 qkv.row_stride, state_.attn_out.row(first_row), c.q_size(), count, *pool_);
  return absl::OkStatus();
}

}  // namespace lamina
