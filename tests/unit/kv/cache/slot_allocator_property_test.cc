// Thousands of random allocate / fork (share) / free / preempt steps against a simple model of the
// allocator: after every step no slot is owned twice, nothing leaks, the counts are exact, and
// allocations reuse the most recently freed slots first.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kv/cache/slot_allocator.h"

namespace lamina {
namespace {

// The model: which holders own which slots, and the free list as a plain stack.
struct Model {
  std::vector<SlotId> free_stack;                 // back = next to hand out
  std::map<int, std::vector<SlotId>> holders;     // sequence -> its slots, in position order

  int64_t RefCount(SlotId s) const {
    int64_t n = 0;
    for (const auto& [seq, slots] : holders) n += std::count(slots.begin(), slots.end(), s);
    return n;
  }
};

void CheckAgainstModel(const SlotAllocator& a, const Model& m, int64_t num_slots) {
  std::set<SlotId> free(m.free_stack.begin(), m.free_stack.end());
  ASSERT_EQ(free.size(), m.free_stack.size()) << "a slot is on the free list twice";
  int64_t shared = 0;
  for (SlotId s = 0; s < num_slots; ++s) {
    const int64_t refs = m.RefCount(s);
    ASSERT_EQ(a.RefCount(s), refs) << "slot " << s;
    ASSERT_EQ(free.count(s) == 1, refs == 0) << "slot " << s << " is both free and held, or neither";
    shared += refs > 1;
    for (const auto& [seq, slots] : m.holders) {
      ASSERT_LE(std::count(slots.begin(), slots.end(), s), 1) << "sequence " << seq << " holds slot " << s << " twice";
    }
  }
  ASSERT_EQ(a.num_free(), static_cast<int64_t>(m.free_stack.size()));
  ASSERT_EQ(a.num_used() + a.num_free(), num_slots) << "leak";
  ASSERT_EQ(a.num_shared(), shared);
}

TEST(SlotAllocatorPropertyTest, RandomOperationsMatchTheModel) {
  constexpr int64_t kSlots = 97;
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    std::mt19937_64 rng(seed);
    SlotAllocator allocator(kSlots);
    Model model;
    for (int64_t s = kSlots - 1; s >= 0; --s) model.free_stack.push_back(static_cast<SlotId>(s));
    int next_seq = 0;
    for (int step = 0; step < 2000; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 4 || model.holders.empty()) {
        // Allocate: a new sequence, or an existing one grows.
        const int64_t count = 1 + static_cast<int64_t>(rng() % 12);
        int seq = model.holders.empty() || rng() % 2 ? next_seq++ : std::next(model.holders.begin(), rng() % model.holders.size())->first;
        std::vector<SlotId> got;
        absl::Status status = allocator.Allocate(count, &got);
        if (count > static_cast<int64_t>(model.free_stack.size())) {
          ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
          ASSERT_TRUE(got.empty()) << "a failed allocation takes nothing";
        } else {
          ASSERT_TRUE(status.ok());
          for (SlotId s : got) {
            ASSERT_EQ(s, model.free_stack.back()) << "LIFO reuse";
            model.free_stack.pop_back();
          }
          auto& slots = model.holders[seq];
          slots.insert(slots.end(), got.begin(), got.end());
        }
      } else if (op < 6) {
        // Fork: a new sequence shares a prefix of an existing one.
        auto it = std::next(model.holders.begin(), rng() % model.holders.size());
        const size_t length = it->second.empty() ? 0 : rng() % (it->second.size() + 1);
        std::vector<SlotId> prefix(it->second.begin(), it->second.begin() + length);
        allocator.Share(prefix);
        model.holders[next_seq++] = prefix;
      } else {
        // Free (a finished request) or preempt (its slots freed, to be recomputed later): the
        // allocator sees both as releasing every slot the sequence holds.
        auto it = std::next(model.holders.begin(), rng() % model.holders.size());
        allocator.Release(it->second);
        std::vector<SlotId> slots = it->second;
        model.holders.erase(it);
        for (auto s = slots.rbegin(); s != slots.rend(); ++s) {
          if (model.RefCount(*s) == 0) model.free_stack.push_back(*s);
        }
      }
      CheckAgainstModel(allocator, model, kSlots);
      if (HasFatalFailure()) {
        ADD_FAILURE() << "seed " << seed << " step " << step;
        return;
      }
    }
  }
}

TEST(SlotAllocatorPropertyTest, AFreedSequenceComesBackAsTheSameRun) {
  SlotAllocator allocator(64);
  std::vector<SlotId> a, b, c;
  ASSERT_TRUE(allocator.Allocate(10, &a).ok());
  ASSERT_TRUE(allocator.Allocate(5, &b).ok());
  allocator.Release(a);
  ASSERT_TRUE(allocator.Allocate(10, &c).ok());
  EXPECT_EQ(c, a);
  for (size_t i = 1; i < c.size(); ++i) EXPECT_EQ(c[i], c[i - 1] + 1) << "runs stay consecutive";
}

}  // namespace
}  // namespace lamina
