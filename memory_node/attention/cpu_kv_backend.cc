#include <cstring>
#include <vector>

#include "common/status/status_macros.h"
#include "memory_node/attention/kv_backend.h"
#include "memory_node/kv_cache/kv_pool.h"

namespace lamina {
namespace {

class CpuKvBackend : public KvBackend {
 public:
  CpuKvBackend(const KvBackendOptions& options, KvPool pool, ThreadPool* threads)
      : options_(options), pool_(std::move(pool)), threads_(threads) {}

  absl::Status Store(int64_t layer, absl::Span<const int32_t> slots, const float* k, const float* v,
                     int64_t row_stride) override {
    const int64_t stride = pool_.shape().slot_stride();
    float* keys = pool_.keys(layer);
    float* values = pool_.values(layer);
    for (size_t t = 0; t < slots.size(); ++t) {
      std::memcpy(keys + slots[t] * stride, k + t * row_stride, stride * sizeof(float));
      std::memcpy(values + slots[t] * stride, v + t * row_stride, stride * sizeof(float));
    }
    return absl::OkStatus();
  }

  absl::Status SetContexts(absl::Span<const int32_t> slot_ids, absl::Span<const int64_t> slot_begin) override {
    slot_ids_ = slot_ids;
    slot_begin_ = slot_begin;
    return absl::OkStatus();
  }

  absl::Status Attend(int64_t layer, const float* q, int64_t q_stride, float* out, int64_t out_stride) override {
    kernels::cpu::DecodeAttention(options_.attention, q, q_stride, pool_.keys(layer), pool_.values(layer),
                                  pool_.shape().slot_stride(), slot_ids_.data(), slot_begin_.data(), out, out_stride,
                                  static_cast<int64_t>(slot_begin_.size()) - 1, *threads_);
    return absl::OkStatus();
  }

 private:
  KvBackendOptions options_;
  KvPool pool_;
  ThreadPool* threads_;
  // The caller keeps these alive between SetContexts and the Attend calls that follow.
  absl::Span<const int32_t> slot_ids_;
  absl::Span<const int64_t> slot_begin_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvBackend>> CreateCpuKvBackend(const KvBackendOptions& options, ThreadPool* pool) {
  const auto& a = options.attention;
  LAMINA_ASSIGN_OR_RETURN(KvPool kv, KvPool::Create({options.num_layers, options.num_slots, a.num_kv_heads, a.head_dim}));
  return std::unique_ptr<KvBackend>(new CpuKvBackend(options, std::move(kv), pool));
}

}  // namespace lamina
