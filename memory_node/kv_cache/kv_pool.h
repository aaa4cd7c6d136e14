// The memory node's KV storage: one K and one V array per layer, each laid out
// [slot][kv_head][head_dim], so one slot holds one token's keys and values for a layer.
// Thread-compatible: concurrent writes to distinct slots are safe.
#ifndef LAMINA_MEMORY_NODE_KV_CACHE_KV_POOL_H_
#define LAMINA_MEMORY_NODE_KV_CACHE_KV_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"

namespace lamina {

struct KvPoolShape {
  int64_t num_layers;
  int64_t num_slots;
  int64_t num_kv_heads;
  int64_t head_dim;

  int64_t slot_stride() const { return num_kv_heads * head_dim; }  // floats per slot per layer
  // Bytes of K and V for one token across all layers.
  int64_t bytes_per_slot() const { return 2 * num_layers * slot_stride() * static_cast<int64_t>(sizeof(float)); }
};

class KvPool {
 public:
  // ResourceExhausted when the pool cannot be allocated.
  static absl::StatusOr<KvPool> Create(const KvPoolShape& shape);

  const KvPoolShape& shape() const { return shape_; }
  float* keys(int64_t layer) { return keys_[layer].data(); }      // [num_slots, kv_heads, head_dim]
  float* values(int64_t layer) { return values_[layer].data(); }  // [num_slots, kv_heads, head_dim]
  const float* keys(int64_t layer) const { return keys_[layer].data(); }
  const float* values(int64_t layer) const { return values_[layer].data(); }

 private:
  explicit KvPool(const KvPoolShape& shape) : shape_(shape) {}

  KvPoolShape shape_;
  std::vector<Tensor> keys_;
  std::vector<Tensor> values_;
};

}  // namespace lamina

#endif  // LAMINA_MEMORY_NODE_KV_CACHE_KV_POOL_H_
