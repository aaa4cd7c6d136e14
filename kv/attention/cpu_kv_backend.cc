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
    return StoreHeads(Whole(), layer, slots, k, v, row_stride);
  }

  absl::Status StoreHeads(const KvHeadWindow& heads, int64_t layer, absl::Span<const int32_t> slots, const float* k,
                          const float* v, int64_t row_stride) override {
    const int64_t stride = pool_.shape().slot_stride();
    const int64_t head_dim = options_.attention.head_dim;
    const int64_t floats = heads.count * head_dim;  // of a row, k or v
    T* keys = pool_.keys(layer) + heads.first * head_dim;
    T* values = pool_.values(layer) + heads.first * head_dim;
    for (size_t t = 0; t < slots.size(); ++t) {
      if constexpr (KvPool<T>::kScaled) {
        const int64_t all_heads = options_.attention.num_kv_heads;
        QuantizeFloat8E4M3(k + t * row_stride, heads.count, head_dim, keys + slots[t] * stride,
                           pool_.key_scales(layer) + slots[t] * all_heads + heads.first);
        QuantizeFloat8E4M3(v + t * row_stride, heads.count, head_dim, values + slots[t] * stride,
                           pool_.value_scales(layer) + slots[t] * all_heads + heads.first);
      } else {
        Put(k + t * row_stride, floats, keys + slots[t] * stride);
        Put(v + t * row_stride, floats, values + slots[t] * stride);
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
      return absl::OkStatus();
    } else {
      return AttendHeads(Whole(), layer, q, q_stride, out, out_stride);
    }
  }

  // The window's heads are a narrower attention over the same slots: their keys and values start
  // `first` heads into each slot's row, which keeps its stride.
  absl::Status AttendHeads(const KvHeadWindow& heads, int64_t layer, const float* q, int64_t q_stride, float* out,
                           int64_t out_stride) override {
    if constexpr (KvPool<T>::kScaled) {
      if (heads.first != 0 || heads.count != options_.attention.num_kv_heads) {
        return absl::UnimplementedError("a float8 KV pool attends whole heads only: give a memory node serving a "
                                        "tensor-parallel group kv_dtype bfloat16 or float32");
      }
      return Attend(layer, q, q_stride, out, out_stride);
    } else {
      const kernels::cpu::AttentionShape& all = options_.attention;
      const int64_t group = all.num_q_heads / all.num_kv_heads;
      const kernels::cpu::AttentionShape window{heads.count * group, heads.count, all.head_dim, all.sliding_window};
      const int64_t offset = heads.first * all.head_dim;
      const int64_t seqs = static_cast<int64_t>(slot_begin_.size()) - 1;
      kernels::cpu::DecodeAttention(window, q, q_stride, pool_.keys(layer) + offset, pool_.values(layer) + offset,
                                    pool_.shape().slot_stride(), slot_ids_.data(), slot_begin_.data(), out,
                                    out_stride, seqs, *threads_);
      return absl::OkStatus();
    }
  }

 private:
  KvHeadWindow Whole() const { return {0, options_.attention.num_kv_heads}; }

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
