// Hands out token slots of a KV pool. The free list is LIFO, so the most recently freed (cache-warm)
// slots are reused first; a fresh pool hands out ascending runs of consecutive slots.
// Thread-compatible: the owner (the attention executor) serialises calls.
#ifndef LAMINA_MEMORY_NODE_KV_CACHE_SLOT_ALLOCATOR_H_
#define LAMINA_MEMORY_NODE_KV_CACHE_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace lamina {

using SlotId = int32_t;

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t num_slots);

  // Appends `count` slots to `out`; ResourceExhausted (and nothing taken) when fewer are free.
  absl::Status Allocate(int64_t count, std::vector<SlotId>* out);
  // Returns slots to the free list; each must have been allocated and not yet freed.
  void Free(const std::vector<SlotId>& slots);

  int64_t num_slots() const { return num_slots_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }

 private:
  int64_t num_slots_;
  std::vector<SlotId> free_;  // top of the stack is the back
};

}  // namespace lamina

#endif  // LAMINA_MEMORY_NODE_KV_CACHE_SLOT_ALLOCATOR_H_
