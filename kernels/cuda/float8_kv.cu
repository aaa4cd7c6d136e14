// The float8 e4m3 KV cache's kernels (attention.h's Float8KvLayer): StoreKv, which quantizes each
// head as the CPU's pool does, and decode attention over it, plain and linked. The decode kernel is
// decode_attention.cu's (decode_kernel.cuh), tiled, its tiles holding codes and scales that each
// warp widens to bf16 (decode_tiles.cuh).
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/decode_kernel.cuh"
#include "kernels/cuda/float8.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kStoreThreads = 128;  // a block per (row, kv head), a thread per dim
constexpr int kMostStoredHeadDim = kStoreThreads;

__global__ void __launch_bounds__(kStoreThreads)
    StoreFloat8Kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t row_stride,
                      const int32_t* __restrict__ slots, Float8KvLayer cache, int kv_heads, int head_dim) {
  StartChained();
  const int kv_head = blockIdx.x;
  const int64_t row = blockIdx.y;
  const int64_t from = row * row_stride + static_cast<int64_t>(kv_head) * head_dim + threadIdx.x;
  const bool mine = static_cast<int>(threadIdx.x) < head_dim;
  const int64_t head = static_cast<int64_t>(slots[row]) * kv_heads + kv_head;
  QuantizeHead(mine ? k[from] : 0.f, head_dim, cache.k_codes + head * head_dim, cache.k_scales + head);
  QuantizeHead(mine ? v[from] : 0.f, head_dim, cache.v_codes + head * head_dim, cache.v_scales + head);
}

// Decode attention over `cache`, linked when `link` is set.
absl::Status DispatchFloat8(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                            const Float8KvLayer& cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                            int64_t out_stride, int64_t num_seqs, float* workspace, const DecodeLink* link,
                            cudaStream_t stream) {
  if (!plan.tiled()) {
    return absl::InvalidArgumentError("decode attention over a float8 cache: the plan must be tiled (Float8Plan)");
  }
  if (plan.splits > kMaxMergedSplits) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode attention: plan of ", plan.splits, " splits (at most ", kMaxMergedSplits, ")"));
  }
  return DispatchShape(shape, [&](auto dim, auto group) {
    return LaunchBlockDecode<decltype(dim)::value, decltype(group)::value>(
        shape, plan, q, q_stride, cache, slot_ids, slot_begin, out, out_stride, num_seqs, workspace, link, stream);
  });
}

}  // namespace

absl::Status StoreKv(const float* k, const float* v, int64_t row_stride, const int32_t* slots,
                     const Float8KvLayer& cache, int64_t count, int64_t kv_heads, int64_t head_dim,
                     cudaStream_t stream) {
  if (head_dim <= 0 || head_dim > kMostStoredHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("StoreKv into a float8 cache: head_dim ", head_dim,
                                                   " (supported: 1 to ", kMostStoredHeadDim, ")"));
  }
  if (count == 0) return absl::OkStatus();
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(
      StoreFloat8Kernel, dim3(static_cast<unsigned>(kv_heads), static_cast<unsigned>(count)), dim3(kStoreThreads), 0,
      stream, k, v, row_stride, slots, cache, static_cast<int>(kv_heads), static_cast<int>(head_dim)));
  return absl::OkStatus();
}

absl::Status DecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q, int64_t q_stride,
                             const Float8KvLayer& cache, const int32_t* slot_ids, const int32_t* slot_begin, float* out,
                             int64_t out_stride, int64_t num_seqs, float* workspace, cudaStream_t stream) {
  if (num_seqs == 0) return absl::OkStatus();
  return DispatchFloat8(shape, plan, q, q_stride, cache, slot_ids, slot_begin, out, out_stride, num_seqs, workspace,
                        nullptr, stream);
}

absl::Status LinkedDecodeAttention(const AttentionShape& shape, const DecodePlan& plan, const float* q,
                                   int64_t q_stride, const Float8KvLayer& cache, const int32_t* slot_ids,
                                   const int32_t* slot_begin, float* out, int64_t out_stride, int64_t num_seqs,
                                   float* workspace, const DecodeLink& link, cudaStream_t stream) {
  LAMINA_RETURN_IF_ERROR(CheckDecodeLink(plan, num_seqs, q, q_stride, out_stride, link));
  return DispatchFloat8(shape, plan, q, q_stride, cache, slot_ids, slot_begin, out, out_stride, num_seqs, workspace,
                        &link, stream);
}

}  // namespace lamina::kernels::cuda
