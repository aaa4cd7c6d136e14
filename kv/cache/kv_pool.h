// The memory node's KV storage on the CPU: one K and one V array per layer, each laid out
// [slot][kv_head][head_dim], so one slot holds one token's keys and values for a layer. The
// element type T is float, uint16_t for bfloat16 values (their bits): half the bytes, so twice
// the tokens in the same memory, and rows read that much faster (kernels/cpu/attention.h), or
// uint8_t for float8 e4m3 values (common/tensor/float8.h), a quarter of float's bytes, with a
// float scale per slot and kv head in arrays of their own, [slot][kv_head].
// Thread-compatible: concurrent writes to distinct slots are safe.
#ifndef LAMINA_KV_CACHE_KV_POOL_H_
#define LAMINA_KV_CACHE_KV_POOL_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina {

struct KvPoolShape {
  int64_t num_layers;
  int64_t num_slots;
  int64_t num_kv_heads;
  int64_t head_dim;

  int64_t slot_stride() const { return num_kv_heads * head_dim; }  // elements per slot per layer
};

template <typename T>
class KvPool {
 public:
  // InvalidArgument for a shape not positive everywhere; ResourceExhausted when the pool cannot
  // be allocated.
  static absl::StatusOr<KvPool> Create(const KvPoolShape& shape);

  // Whether each slot's heads carry a scale: float8's do.
  static constexpr bool kScaled = std::is_same_v<T, uint8_t>;

  // Bytes of K and V for one token across all layers, scales included.
  static int64_t BytesPerSlot(const KvPoolShape& shape) {
    const int64_t scales = kScaled ? shape.num_kv_heads * static_cast<int64_t>(sizeof(float)) : 0;
    return 2 * shape.num_layers * (shape.slot_stride() * static_cast<int64_t>(sizeof(T)) + scales);
  }

  const KvPoolShape& shape() const { return shape_; }
  T* keys(int64_t layer) { return keys_[layer].data(); }      // [num_slots, kv_heads, head_dim]
  T* values(int64_t layer) { return values_[layer].data(); }  // [num_slots, kv_heads, head_dim]
  const T* keys(int64_t layer) const { return keys_[layer].data(); }
  const T* values(int64_t layer) const { return values_[layer].data(); }
  // The scales of a float8 pool's heads (empty for other types).
  float* key_scales(int64_t layer) { return key_scales_[layer].data(); }      // [num_slots, kv_heads]
  float* value_scales(int64_t layer) { return value_scales_[layer].data(); }  // [num_slots, kv_heads]

 private:
  explicit KvPool(const KvPoolShape& shape) : shape_(shape) {}

  KvPoolShape shape_;
  std::vector<std::vector<T>> keys_;
  std::vector<std::vector<T>> values_;
  std::vector<std::vector<float>> key_scales_;
  std::vector<std::vector<float>> value_scales_;
};

extern template class KvPool<float>;
extern template class KvPool<uint16_t>;
extern template class KvPool<uint8_t>;

}  // namespace lamina

#endif  // LAMINA_KV_CACHE_KV_POOL_H_
