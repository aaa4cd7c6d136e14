#include "memory_node/kv_cache/kv_pool.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace lamina {

absl::StatusOr<KvPool> KvPool::Create(const KvPoolShape& shape) {
  if (shape.num_layers <= 0 || shape.num_slots <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError("KV pool shape must be positive in every dimension");
  }
  KvPool pool(shape);
  try {
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      pool.keys_.emplace_back(std::vector<int64_t>{shape.num_slots, shape.num_kv_heads, shape.head_dim});
      pool.values_.emplace_back(std::vector<int64_t>{shape.num_slots, shape.num_kv_heads, shape.head_dim});
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a KV pool of ", shape.num_slots,
                                                     " slots (", shape.num_slots * shape.bytes_per_slot(),
                                                     " bytes)"));
  }
  return pool;
}

}  // namespace lamina
