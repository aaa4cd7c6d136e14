#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/tensor/dtype.h"
#include "common/tensor/float8.h"
#include "kv/attention/kv_backend.h"
#include "kv/cache/kv_pool.h"

namespace lamina {
namespace {

// Writes `count` floats of `src` into `dst` as the pool's element type.
void Put(const float* src, int64_t count, float* dst) { std::memcpy(dst, src, count * sizeof(float)); }
void Put(const float* src, int64_t count, uint16_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = FloatToBFloat16(src[i]);
}

// T: the pool's element type, float, uint16_t (bfloat16 bits) or uint8_t (float8 e4m3 bits, each
// head with its scale).
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
      if constexpr (KvPool<T>::kScaled) {
        const int64_t heads = options_.attention.num_kv_heads, head_dim = options_.attention.head_dim;
        QuantizeFloat8E4M3(k + t * row_stride, heads, head_dim, keys + slots[t] * stride,
                           pool_.key_scales(layer) + slots[t] * heads);
        QuantizeFloat8E4M3(v + t * row_stride, heads, head_dim, values + slots[t] * stride,
                           pool_.value_scales(layer) + slots[t] * heads);
      } else {
        Put(k + t * row_stride, stride, keys + slots[t] * stride);
        Put(v + t * row_stride, stride, values + slots[t] * stride);
      }
    }
    return absl::OkStatus();
  }

  absl::Status SetContexts(absl::Span<const int32_t> slot_ids, absl::Span<const int64_t> slot_begin) override {
    slot_ids_ = slot_ids;
    slot_begin_ = slot_begin;
    return absl::OkStatus();
  }

  absl::Status Attend(int64_t layer, const float* q, int64_t q_stride, float* out, int64_t out_stride) override {
    const int64_t seqs = static_cast<int64_t>(slot_begin_.size()) - 1;
    if constexpr (KvPool<T>::kScaled) {
      kernels::cpu::DecodeAttention(options_.attention, q, q_stride, pool_.keys(layer), pool_.values(layer),
                                    pool_.shape().slot_stride(), pool_.key_scales(layer), pool_.value_scales(layer),
                                    slot_ids_.data(), slot_begin_.data(), out, out_stride, seqs, *threads_);
    } else {
      kernels::cpu::DecodeAttention(options_.attention, q, q_stride, pool_.keys(layer), pool_.values(layer),
                                    pool_.shape().slot_stride(), slot_ids_.data(), slot_begin_.data(), out, out_stride,
                                    seqs, *threads_);
    }
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
    case DType::kF8E4M3:
      return Create<uint8_t>(options, pool);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("a KV pool on the CPU holds F32, BF16 or F8_E4M3, not ", DTypeName(options.kv_dtype)));
  }
}

}  // namespace lamina
