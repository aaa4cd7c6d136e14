// Hands out the token slots of a KV pool, with reference counts so that sequences can share slots
// (a fork for several samples from one prompt, a cached prompt prefix) without copying KV bytes.
//
// The free list is LIFO: the most recently freed (cache-warm) slots are reused first. A fresh pool
// hands out ascending runs, and a sequence's slots are returned so that the next allocation gets
// them back in the same order, keeping runs of consecutive slots together (coalesced reads).
// A slot returns to the free list when its count drops to zero. Allocation is token-granular: no
// rounding to pages, so nothing is wasted inside a sequence.
// Thread-compatible: the owner (the attention executor) serialises calls.
#ifndef LAMINA_KV_CACHE_SLOT_ALLOCATOR_H_
#define LAMINA_KV_CACHE_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace lamina {

using SlotId = int32_t;

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t num_slots);

  // Appends `count` slots, each with one reference, to `out`; ResourceExhausted (and nothing
  // taken) when fewer are free.
  absl::Status Allocate(int64_t count, std::vector<SlotId>* out);
  // Adds one reference to each slot; each must be in use.
  void Share(absl::Span<const SlotId> slots);
  // Drops one reference from each slot; a slot whose count reaches zero is free again. Slots are
  // returned last-to-first, so the list's first slot is the next one handed out.
  void Release(absl::Span<const SlotId> slots);

  int32_t RefCount(SlotId slot) const { return refs_[slot]; }
  int64_t num_slots() const { return static_cast<int64_t>(refs_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_slots() - num_free(); }
  // Slots held by more than one sequence.
  int64_t num_shared() const { return num_shared_; }

 private:
  std::vector<int32_t> refs_;  // [num_slots] reference counts; 0 = free
  std::vector<SlotId> free_;   // top of the stack is the back
  int64_t num_shared_ = 0;
};

}  // namespace lamina

#endif  // LAMINA_KV_CACHE_SLOT_ALLOCATOR_H_
