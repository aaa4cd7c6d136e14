#include "memory_node/kv_cache/slot_allocator.h"

#include "absl/strings/str_cat.h"

namespace lamina {

SlotAllocator::SlotAllocator(int64_t num_slots) : num_slots_(num_slots) {
  free_.reserve(num_slots);
  // Pushed in descending order so that pops come out ascending.
  for (int64_t s = num_slots - 1; s >= 0; --s) free_.push_back(static_cast<SlotId>(s));
}

absl::Status SlotAllocator::Allocate(int64_t count, std::vector<SlotId>* out) {
  if (count > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool has ", num_free(), " free slots of ",
                                                     num_slots_, "; ", count, " needed"));
  }
  for (int64_t i = 0; i < count; ++i) {
    out->push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void SlotAllocator::Free(const std::vector<SlotId>& slots) {
  // Freed in reverse so the sequence's first slot is on top: its run is reused in order.
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) free_.push_back(*it);
}

}  // namespace lamina
