// The KV pool in GPU memory (one [slot][kv_head][head_dim] array per layer for K and for V, of bf16
// values, or of float8 codes with a [slot][kv_head] array of scales each) with the CUDA kernels:
// the pool itself and the host path (Store, Attend: host inputs staged on the node's stream,
// Attend returning once the outputs are back in host memory). Its device lanes
// (cuda_kv_backend.cc) and local steps (cuda_local_step.cc) read it through the accessors below.
// Internal to kv/attention: callers make a backend with CreateCudaKvBackend (kv_backend.h).
// Thread-compatible, as KvBackend.
#ifndef LAMINA_KV_ATTENTION_CUDA_KV_POOL_H_
#define LAMINA_KV_ATTENTION_CUDA_KV_POOL_H_

#include <cuda_bf16.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kv/attention/kv_backend.h"
#include "kv/attention/spin_budget.h"

namespace lamina {
namespace cuda_kv {

using bf16 = __nv_bfloat16;
namespace kc = kernels::cuda;

class CudaKvBackend : public KvBackend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaKvBackend>> Create(const KvBackendOptions& options, int device) {
    LAMINA_RETURN_IF_ERROR(UseDevice({true, device}));
    std::unique_ptr<CudaKvBackend> b(new CudaKvBackend(options, device));
    // Values first (bf16, or float8 codes), then float8's scales.
    const int64_t value_bytes = b->float8_ ? 1 : static_cast<int64_t>(sizeof(bf16));
    b->scales_offset_ = 2 * options.num_layers * b->layer_slots_ * b->kv_size_ * value_bytes;
    const int64_t scale_bytes =
        b->float8_ ? 2 * options.num_layers * b->layer_slots_ * options.attention.num_kv_heads * sizeof(float) : 0;
    absl::StatusOr<cuda::DeviceBuffer> pool = cuda::DeviceBuffer::Create(b->scales_offset_ + scale_bytes);
    if (!pool.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("KV pool of ", options.num_slots, " slots does not fit on cuda:",
                                                       device, ": ", pool.status().message()));
    }
    b->pool_ = std::move(*pool);
    LAMINA_ASSIGN_OR_RETURN(b->stream_, cuda::Stream::Create());
    LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&b->num_sms_, cudaDevAttrMultiProcessorCount, device));
    b->spin_budget_ = SpinBudget::ForSms(b->num_sms_);
    return b;
  }

  absl::Status Store(int64_t layer, absl::Span<const int32_t> slots, const float* k, const float* v,
                     int64_t row_stride) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const int64_t n = static_cast<int64_t>(slots.size());
    if (n == 0) return absl::OkStatus();
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&stage_k_, n * kv_size_ * sizeof(float), stream_.get()));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&stage_v_, n * kv_size_ * sizeof(float), stream_.get()));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&stage_slots_, n * sizeof(int32_t), stream_.get()));
    const size_t row_bytes = kv_size_ * sizeof(float);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(stage_k_.data(), row_bytes, k, row_stride * sizeof(float), row_bytes,
                                                  n, cudaMemcpyHostToDevice, stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(stage_v_.data(), row_bytes, v, row_stride * sizeof(float), row_bytes,
                                                  n, cudaMemcpyHostToDevice, stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(stage_slots_.data(), slots.data(), n * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream()));
    // No wait here: copies from pageable memory return once the source is staged, the next use of
    // the staging buffers is ordered after this kernel on the same stream, and growing them
    // (cudaFree) synchronizes. Attend() waits for its own results.
    return StoreRows(layer, stage_k_.as<float>(), stage_v_.as<float>(), kv_size_, stage_slots_.as<int32_t>(), n,
                     stream());
  }

  absl::Status SetContexts(absl::Span<const int32_t> slot_ids, absl::Span<const int64_t> slot_begin) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    num_seqs_ = static_cast<int64_t>(slot_begin.size()) - 1;
    max_context_ = 0;
    std::vector<int32_t> begin32(slot_begin.size());
    for (size_t i = 0; i < slot_begin.size(); ++i) {
      begin32[i] = static_cast<int32_t>(slot_begin[i]);
      if (i > 0) max_context_ = std::max(max_context_, slot_begin[i] - slot_begin[i - 1]);
    }
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(
        &slot_ids_, std::max<size_t>(1, slot_ids.size()) * sizeof(int32_t), stream_.get()));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&slot_begin_, begin32.size() * sizeof(int32_t), stream_.get()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot_ids_.data(), slot_ids.data(), slot_ids.size() * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot_begin_.data(), begin32.data(), begin32.size() * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream()));
    plan_ = Plan(num_seqs_, max_context_, num_sms_);
    LAMINA_RETURN_IF_ERROR(
        cuda::EnsureCapacityOnStream(&workspace_, std::max<int64_t>(1, plan_.workspace_floats) * sizeof(float),
                                     stream_.get()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));  // begin32 goes away on return
    return absl::OkStatus();
  }

  absl::Status Attend(int64_t layer, const float* q, int64_t q_stride, float* out, int64_t out_stride) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (num_seqs_ == 0) return absl::OkStatus();
    const int64_t q_size = options_.attention.num_q_heads * options_.attention.head_dim;
    const size_t row_bytes = q_size * sizeof(float);
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&q_, num_seqs_ * row_bytes, stream_.get()));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&out_, num_seqs_ * row_bytes, stream_.get()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(q_.data(), row_bytes, q, q_stride * sizeof(float), row_bytes,
                                                  num_seqs_, cudaMemcpyHostToDevice, stream()));
    LAMINA_RETURN_IF_ERROR(Decode(layer, plan_, q_.as<float>(), q_size, slot_ids_.as<int32_t>(),
                                  slot_begin_.as<int32_t>(), out_.as<float>(), q_size, num_seqs_,
                                  workspace_.as<float>(), stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(out, out_stride * sizeof(float), out_.data(), row_bytes, row_bytes,
                                                  num_seqs_, cudaMemcpyDeviceToHost, stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
    return absl::OkStatus();
  }

  int device() const override { return device_; }
  absl::StatusOr<std::unique_ptr<DeviceKvLane>> NewDeviceLane(int max_chunks) override;
  absl::StatusOr<std::unique_ptr<LocalKvStep>> NewLocalStep() override;
  // The slot past the pool's own, which no sequence holds.
  int32_t scratch_slot() const { return static_cast<int32_t>(options_.num_slots); }

  // What a lane reads of the pool.
  const KvBackendOptions& options() const { return options_; }
  int num_sms() const { return num_sms_; }
  SpinBudget* spin_budget() const { return spin_budget_.get(); }
  cudaStream_t host_path_stream() const { return stream_.get(); }

  // A decode plan over this pool (tiled for float8, kc::Float8Plan).
  kc::DecodePlan Plan(int64_t num_seqs, int64_t max_context, int num_sms) const {
    const kc::DecodePlan plan = kc::PlanDecode(options_.attention, num_seqs, max_context, num_sms);
    return float8_ ? kc::Float8Plan(plan) : plan;
  }
  // `plan` (Plan's) for a linked launch that polls its own packets (kc::PlanPolledDecode; float8
  // caches keep their tiles).
  kc::DecodePlan PolledPlan(const kc::DecodePlan& plan, int64_t num_seqs, int64_t max_context, int num_sms) const {
    return float8_ ? plan : kc::PlanPolledDecode(options_.attention, plan, num_seqs, max_context, num_sms);
  }

  // The pool's kernels for one layer, whatever its element type: k/v rows (float, [count,
  // row_stride]) stored at `slots`; decode attention; the same linked.
  absl::Status StoreRows(int64_t layer, const float* k, const float* v, int64_t row_stride, const int32_t* slots,
                         int64_t count, cudaStream_t stream) const {
    if (float8_) {
      return kc::StoreKv(k, v, row_stride, slots, Float8Layer(layer), count, options_.attention.num_kv_heads,
                         options_.attention.head_dim, stream);
    }
    return kc::StoreKv(k, v, row_stride, slots, keys(layer), values(layer), count, kv_size_, stream);
  }
  absl::Status Decode(int64_t layer, const kc::DecodePlan& plan, const float* q, int64_t q_stride,
                      const int32_t* slot_ids, const int32_t* slot_begin, float* out, int64_t out_stride,
                      int64_t num_seqs, float* workspace, cudaStream_t stream) const {
    if (float8_) {
      return kc::DecodeAttention(options_.attention, plan, q, q_stride, Float8Layer(layer), slot_ids, slot_begin, out,
                                 out_stride, num_seqs, workspace, stream);
    }
    return kc::DecodeAttention(options_.attention, plan, q, q_stride, keys(layer), values(layer), slot_ids, slot_begin,
                               out, out_stride, num_seqs, workspace, stream);
  }
  absl::Status LinkedDecode(int64_t layer, const kc::DecodePlan& plan, const float* q, int64_t q_stride,
                            const int32_t* slot_ids, const int32_t* slot_begin, float* out, int64_t out_stride,
                            int64_t num_seqs, float* workspace, const kc::DecodeLink& link, cudaStream_t stream) const {
    if (float8_) {
      return kc::LinkedDecodeAttention(options_.attention, plan, q, q_stride, Float8Layer(layer), slot_ids, slot_begin,
                                       out, out_stride, num_seqs, workspace, link, stream);
    }
    return kc::LinkedDecodeAttention(options_.attention, plan, q, q_stride, keys(layer), values(layer), slot_ids,
                                     slot_begin, out, out_stride, num_seqs, workspace, link, stream);
  }

 private:
  CudaKvBackend(const KvBackendOptions& options, int device)
      : options_(options),
        device_(device),
        float8_(options.kv_dtype == DType::kF8E4M3),
        kv_size_(options.attention.num_kv_heads * options.attention.head_dim),
        layer_slots_(options.num_slots + 1) {}
  cudaStream_t stream() const { return stream_.get(); }

  bf16* keys(int64_t layer) const { return pool_.as<bf16>() + (2 * layer) * layer_slots_ * kv_size_; }
  bf16* values(int64_t layer) const { return pool_.as<bf16>() + (2 * layer + 1) * layer_slots_ * kv_size_; }
  kc::Float8KvLayer Float8Layer(int64_t layer) const {
    uint8_t* codes = pool_.as<uint8_t>();
    float* scales = reinterpret_cast<float*>(codes + scales_offset_);
    const int64_t layer_codes = layer_slots_ * kv_size_;
    const int64_t layer_scales = layer_slots_ * options_.attention.num_kv_heads;
    return {codes + 2 * layer * layer_codes, codes + (2 * layer + 1) * layer_codes, scales + 2 * layer * layer_scales,
            scales + (2 * layer + 1) * layer_scales};
  }

  KvBackendOptions options_;
  int device_;
  bool float8_;  // the pool's element type: float8 codes and scales, else bf16
  int64_t kv_size_;
  // Slots a layer holds: the pool's, then one scratch slot that a local step's padding rows write
  // and read (scratch_slot()).
  int64_t layer_slots_;
  int64_t scales_offset_ = 0;  // float8: bytes into pool_ where the scales start
  int num_sms_ = 0;
  std::unique_ptr<SpinBudget> spin_budget_;  // shared by the lanes: blocks waiting for rows
  // bf16 [layers][K, V][num_slots + 1, kv_heads, head_dim]; float8: the same of uint8 codes, then
  // float [layers][K, V][num_slots + 1, kv_heads] scales.
  cuda::DeviceBuffer pool_;
  cuda::Stream stream_;
  // Staging, grown on demand and reused.
  cuda::DeviceBuffer stage_k_, stage_v_;  // float [rows, kv_size]
  cuda::DeviceBuffer stage_slots_;        // int32 [rows]
  cuda::DeviceBuffer slot_ids_;           // int32 [total context]
  cuda::DeviceBuffer slot_begin_;         // int32 [seqs + 1]
  cuda::DeviceBuffer q_, out_;            // float [seqs, q_size]
  cuda::DeviceBuffer workspace_;          // float [plan_.workspace_floats]
  int64_t num_seqs_ = 0;
  int64_t max_context_ = 0;
  kc::DecodePlan plan_;
};

// A new local step over `pool` (cuda_local_step.cc).
absl::StatusOr<std::unique_ptr<LocalKvStep>> NewCudaLocalStep(const CudaKvBackend* pool);

}  // namespace cuda_kv
}  // namespace lamina

#endif  // LAMINA_KV_ATTENTION_CUDA_KV_POOL_H_
