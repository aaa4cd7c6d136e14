#include "kv/cache/slot_allocator.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {

SlotAllocator::SlotAllocator(int64_t num_slots) : refs_(num_slots, 0) {
  free_.reserve(num_slots);
  // Pushed in descending order so that pops come out ascending.
  for (int64_t s = num_slots - 1; s >= 0; --s) free_.push_back(static_cast<SlotId>(s));
}

absl::Status SlotAllocator::Allocate(int64_t count, std::vector<SlotId>* out) {
  if (count > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool has ", num_free(), " free slots of ", num_slots(), "; ",
                                                     count, " needed"));
  }
  for (int64_t i = 0; i < count; ++i) {
    const SlotId slot = free_.back();
    free_.pop_back();
    refs_[slot] = 1;
    out->push_back(slot);
  }
  return absl::OkStatus();
}

void SlotAllocator::Share(absl::Span<const SlotId> slots) {
  for (SlotId slot : slots) {
    LAMINA_CHECK(refs_[slot] > 0);
    if (++refs_[slot] == 2) ++num_shared_;
  }
}

void SlotAllocator::Release(absl::Span<const SlotId> slots) {
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    const SlotId slot = *it;
    LAMINA_CHECK(refs_[slot] > 0);
    if (--refs_[slot] == 1) --num_shared_;
    if (refs_[slot] == 0) free_.push_back(slot);
  }
}

}  // namespace lamina
