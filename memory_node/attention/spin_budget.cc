#include "memory_node/attention/spin_budget.h"

#include <algorithm>

namespace lamina {

std::unique_ptr<SpinBudget> SpinBudget::ForSms(int64_t sms) {
  return std::make_unique<SpinBudget>(std::max<int64_t>(1, sms / 2), std::max<int64_t>(1, sms - kSmsLeftByALoneLane));
}

int64_t SpinBudget::CountOf(int64_t blocks, int64_t blocks_an_sm) const {
  if (lanes_.load(std::memory_order_relaxed) > 1 || blocks_an_sm <= 1) return blocks;
  const int64_t an_sm = blocks_an_sm * kLoneLaneWaves;
  return (blocks + an_sm - 1) / an_sm;
}

bool SpinBudget::TryTake(int64_t blocks) {
  const int64_t limit = this->limit();
  int64_t taken = taken_.load(std::memory_order_relaxed);
  do {
    if (taken + blocks > limit) return false;
  } while (!taken_.compare_exchange_weak(taken, taken + blocks, std::memory_order_relaxed));
  return true;
}

ChunkWait ChooseChunkWait(bool waits, bool lines, int64_t rows, int64_t launch_blocks, int64_t most_in_launch,
                          SpinBudget* budget, int64_t launch_blocks_an_sm) {
  ChunkWait wait;
  if (!waits) return wait;
  const int64_t counted = budget->CountOf(launch_blocks, launch_blocks_an_sm);
  if (counted <= most_in_launch && budget->TryTake(counted)) {
    wait.in_launch = true;
    wait.spinning = counted;
    return wait;
  }
  if (!lines) {
    wait.ahead_blocks = 1;
  } else if (budget->TryTake(rows)) {
    wait.ahead_blocks = rows;
    wait.spinning = rows;
    return wait;
  } else {
    wait.ahead_blocks = std::min(rows, kFewestPollingBlocks);
  }
  budget->Take(wait.ahead_blocks);
  wait.spinning = wait.ahead_blocks;
  return wait;
}

int FewestPairsPerBlock(int64_t pairs, int64_t most_in_launch, const SpinBudget& budget,
                        absl::FunctionRef<int64_t(int)> blocks_an_sm) {
  const int64_t room = std::min(most_in_launch, budget.left());
  for (const int64_t within : {std::min(room, budget.share()), room}) {
    for (int width : {1, 2, 4}) {
      if (budget.CountOf((pairs + width - 1) / width, blocks_an_sm(width)) <= within) return width;
    }
  }
  return 1;
}

}  // namespace lamina
