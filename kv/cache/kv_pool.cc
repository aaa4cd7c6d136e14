#include "kv/cache/kv_pool.h"

#include <new>

#include "absl/strings/str_cat.h"
#include "common/process/host_memory.h"
#include "common/status/status_macros.h"

namespace lamina {

template <typename T>
absl::StatusOr<KvPool<T>> KvPool<T>::Create(const KvPoolShape& shape) {
  if (shape.num_layers <= 0 || shape.num_slots <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError("KV pool shape must be positive in every dimension");
  }
  LAMINA_RETURN_IF_ERROR(CheckHostMemoryFor(
      absl::StrCat("a KV pool of ", shape.num_slots, " slots and ", shape.num_layers, " layers"),
      shape.num_slots * BytesPerSlot(shape)));
  KvPool pool(shape);
  const size_t elements = static_cast<size_t>(shape.num_slots * shape.slot_stride());
  const size_t scales = kScaled ? static_cast<size_t>(shape.num_slots * shape.num_kv_heads) : 0;
  try {
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      pool.keys_.emplace_back(elements);
      pool.values_.emplace_back(elements);
      pool.key_scales_.emplace_back(scales);
      pool.value_scales_.emplace_back(scales);
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a KV pool of ", shape.num_slots, " slots (",
                                                     shape.num_slots * BytesPerSlot(shape), " bytes)"));
  }
  return pool;
}

template class KvPool<float>;
template class KvPool<uint16_t>;
template class KvPool<uint8_t>;

}  // namespace lamina
