#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/tensor/dtype.h"
#include "memory_node/attention/kv_backend.h"
#include "memory_node/kv_cache/kv_pool.h"

namespace lamina {
namespace {

// Writes `count` floats of `src` into `dst` as the pool's element type.
void Put(const float* src, int64_t count, float* dst) { std::memcpy(dst, src, count * sizeof(float)); }
void Put(const float* src, int64_t count, uint16_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = FloatToBFloat16(src[i]);
}

// T: the pool's element type, float or uint16_t (bfloat16 bits).
template <typename T>
class CpuKvBackend : public KvBackend {
 public:
  CpuKvBackend(const KvBackendOptions& options, KvPool<T> pool, ThreadPool* threads)
      : options_(options), pool_(std::move(pool)), threads_(threads) {}

  absl::Status Store(int64_t layer, absl::Span<const int32_t> slots, const float* k, const float* v,
                     int64_t row_stride) override {
    const int64_t stride = pool_.shape().slot_stride();
    T* keys = pool_.keys(layer);
    T* values = pool_.values(layer);
    for (size_t t = 0; t < slots.size(); ++t) {
      Put(k + t * row_stride, stride, keys + slots[t] * stride);
      Put(v + t * row_stride, stride, values + slots[t] * stride);
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
  KvPool<T> pool_;
  ThreadPool* threads_;
  // The caller keeps these alive between SetContexts and the Attend calls that follow.
  absl::Span<const int32_t> slot_ids_;
  absl::Span<const int64_t> slot_begin_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<KvBackend>> Create(const KvBackendOptions& options, ThreadPool* pool) {
  const auto& a = options.attention;
  LAMINA_ASSIGN_OR_RETURN(KvPool<T> kv,
                          KvPool<T>::Create({options.num_layers, options.num_slots, a.num_kv_heads, a.head_dim}));
  return std::unique_ptr<KvBackend>(new CpuKvBackend<T>(options, std::move(kv), pool));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvBackend>> CreateCpuKvBackend(const KvBackendOptions& options, ThreadPool* pool) {
  switch (options.kv_dtype) {
    case DType::kF32:
      return Create<float>(options, pool);
    case DType::kBF16:
      return Create<uint16_t>(options, pool);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("a KV pool on the CPU holds F32 or BF16, not ", DTypeName(options.kv_dtype)));
  }
}

}  // namespace lamina
