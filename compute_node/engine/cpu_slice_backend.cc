#include "compute_node/engine/cpu_slice_backend.h"

#include <cstring>

#include "kernels/cpu/attention.h"

namespace lamina {

absl::Status CpuSliceBackend::RunFirst(absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions) {
  state_.positions.assign(positions.begin(), positions.end());
  slices_.RunFirst(tokens, &state_);
  return absl::OkStatus();
}

absl::Status CpuSliceBackend::RunMiddle(int64_t slice) {
  return slices_.RunMiddle(slice, &state_);
}

absl::Status CpuSliceBackend::RunLast(absl::Span<const int64_t> rows, Tensor* logits) {
  return slices_.RunLast(rows, &state_, logits);
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

absl::Status CpuSliceBackend::ReadResidual(float* out) {
  std::memcpy(out, state_.residual.data(), state_.residual.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuSliceBackend::ReadAttnOut(float* out) {
  std::memcpy(out, state_.attn_out.data(), state_.attn_out.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuSliceBackend::ResumeAt(absl::Span<const int32_t> positions, const float* residual,
                                       const float* attn_out) {
  const ModelConfig& c = config();
  const int64_t n = static_cast<int64_t>(positions.size());
  state_.positions.assign(positions.begin(), positions.end());
  if (state_.residual.rank() != 2 || state_.residual.dim(0) != n) state_.residual.Reshape({n, c.hidden_size});
  if (state_.attn_out.rank() != 2 || state_.attn_out.dim(0) != n) state_.attn_out.Reshape({n, c.q_size()});
  std::memcpy(state_.residual.data(), residual, n * c.hidden_size * sizeof(float));
  std::memcpy(state_.attn_out.data(), attn_out, n * c.q_size() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace lamina
