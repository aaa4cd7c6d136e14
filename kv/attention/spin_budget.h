// How many thread blocks a memory node's linked decode steps may keep spinning on its GPU at once.
//
// A linked step queues its layers' attention ahead of their rows, and something on the GPU waits
// for each: the attention launch itself (each block polls) or a small kernel queued before it. A
// waiting block holds its SM's share until the rows arrive. The rows come from a compute node that
// interleaves the lanes' layers, so one lane's rows may follow another lane's attention; were that
// attention unable to find an SM free of waiting blocks, the two would wait on each other until
// their timeouts (it happened: two lanes of 128-block launches stalled a rotating cluster).
//
// So the lanes of one GPU share a budget of waiting blocks, half its SMs: blocks past it wait in no
// SM, and every launch that follows its rows finds SMs. A GPU's lone lane (one batch: no other
// lane's attention can come between it and its rows) may take all but a few SMs, as a launch past
// the budget waits behind a kernel, which costs a lone lane's large launches markedly. A lone lane
// counts a launch's blocks by the SMs they fill over kLoneLaneWaves waves (small blocks share an
// SM; the second wave takes the first's SMs as they end, in the order the rows arrive). With
// several lanes, or a compute end on the same GPU, each block counts as an SM: the scheduler
// spreads a launch's blocks an SM each first, and two waves of polling blocks would keep the
// sender's kernel off every SM. Launches are cut into the fewest pairs a block that fit
// (FewestPairsPerBlock). The figures behind these choices: tests/bench/RESULTS.md and its history.
// A lane takes its step's blocks when it queues the step's first layer and gives them back when
// the step has ended. Thread-safe.
#ifndef LAMINA_KV_ATTENTION_SPIN_BUDGET_H_
#define LAMINA_KV_ATTENTION_SPIN_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"

namespace lamina {

class SpinBudget {
 public:
  // `shared_limit` with several lanes, `lone_limit` with one.
  SpinBudget(int64_t shared_limit, int64_t lone_limit) : shared_limit_(shared_limit), lone_limit_(lone_limit) {}
  // Half of `sms` with several lanes; all but kSmsLeftByALoneLane with one.
  static std::unique_ptr<SpinBudget> ForSms(int64_t sms);
  SpinBudget(const SpinBudget&) = delete;
  SpinBudget& operator=(const SpinBudget&) = delete;

  // A lane is created on the GPU (the id it steps under returned), or goes.
  int AddLane();
  void RemoveLane(int lane);

  // `lane` begins a step (its first layer not yet queued), or has ended one. BeginStep returns the
  // lane's share of limit() for the step: the limit over the lanes stepping, which are `lane`,
  // those with a step open, and those that began a step since `lane` began its last (or, before
  // its first, since it was added). A lane whose steps alternate with others' counts them all; a
  // lane that steps while the others idle (a memory node serving one batch of several it holds)
  // has the whole limit from its second step on.
  int64_t BeginStep(int lane);
  void EndStep(int lane);

  // Takes `blocks` if they fit in what is left of limit(); else takes nothing and returns false.
  bool TryTake(int64_t blocks);
  // Takes `blocks` whether or not they fit: for the few blocks a wait needs at the least.
  void Take(int64_t blocks) { taken_.fetch_add(blocks, std::memory_order_relaxed); }
  void Give(int64_t blocks) { taken_.fetch_sub(blocks, std::memory_order_relaxed); }

  // What a launch of `blocks` blocks, `blocks_an_sm` of which an SM holds at once, counts against
  // limit(): its SMs' worth over kLoneLaneWaves waves, rounded up, for a lone lane; every block
  // with several.
  int64_t CountOf(int64_t blocks, int64_t blocks_an_sm) const;

  // The limit for the lanes there are now.
  int64_t limit() const { return lanes_.load(std::memory_order_relaxed) > 1 ? shared_limit_ : lone_limit_; }
  int64_t taken() const { return taken_.load(std::memory_order_relaxed); }
  // What is left of limit() now (a lane taking at once may leave less by its TryTake).
  int64_t left() const { return limit() - taken(); }

 private:
  // A lane's steps: whether one is open, and the count of steps begun on the GPU when it began its
  // last (when it was added, before its first).
  struct LaneSteps {
    bool open = false;
    uint64_t began = 0;
  };

  const int64_t shared_limit_, lone_limit_;
  std::atomic<int64_t> lanes_{0};
  std::atomic<int64_t> taken_{0};
  std::mutex mu_;  // taken once a step and lane, not a layer
  std::map<int, LaneSteps> steps_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_begun_ ABSL_GUARDED_BY(mu_) = 0;
  int next_lane_ ABSL_GUARDED_BY(mu_) = 0;
};

// The SMs a lone lane leaves free of waiting blocks, for the memory node's other work.
inline constexpr int64_t kSmsLeftByALoneLane = 4;
// The waves of small blocks a lone lane counts an SM for (SpinBudget::CountOf).
inline constexpr int64_t kLoneLaneWaves = 2;

// How a linked chunk waits for its rows, and the blocks that spin meanwhile (taken from the budget).
struct ChunkWait {
  bool in_launch = false;    // the attention launch's own blocks poll; else a kernel queued ahead
  int64_t ahead_blocks = 0;  // the kernel ahead's blocks (a block a row of lines, or 1 on a flag)
  int64_t spinning = 0;      // what was taken
};

// The most blocks a kernel ahead polls lines with when the budget has no room for a block a row.
inline constexpr int64_t kFewestPollingBlocks = 4;

// Chooses how a chunk of `rows` rows waits, whose attention launch has `launch_blocks` blocks,
// `launch_blocks_an_sm` of which an SM holds at once, and may poll for itself while they count
// (SpinBudget::CountOf) at most `most_in_launch` (`lines`: its rows arrive as lines, which a kernel
// ahead polls a block a row; else behind a flag or as packets, which one block waits on). The
// launch polls when it may and its count fits the budget; else the kernel ahead does, with a block
// a row if they fit and at most kFewestPollingBlocks if not. `waits` false (the rows are in
// place): nothing spins.
ChunkWait ChooseChunkWait(bool waits, bool lines, int64_t rows, int64_t launch_blocks, int64_t most_in_launch,
                          SpinBudget* budget, int64_t launch_blocks_an_sm = 1);

// The (sequence, kv head) pairs a block of a polling kWarpPerQueryHead launch of `pairs` pairs
// serves (kernels/cuda/attention.h, DecodePlan::pairs_per_block): the fewest of 1, 2 and 4 with
// which its blocks count (CountOf, `blocks_an_sm(width)` of them an SM) within `most_in_launch` and
// the lane's `share` of the budget for the step (SpinBudget::BeginStep), else within what is left of
// it now, so that the launch polls for itself (ChooseChunkWait) rather than behind a kernel queued
// ahead; 1 where none does. Within the share first, so that a lane that queues its step first
// leaves the others room for theirs; a share counts only the lanes stepping, so that a lane
// stepping alone does not pay for blocks wider than it needs.
int FewestPairsPerBlock(int64_t pairs, int64_t most_in_launch, int64_t share, const SpinBudget& budget,
                        absl::FunctionRef<int64_t(int)> blocks_an_sm);

}  // namespace lamina

#endif  // LAMINA_KV_ATTENTION_SPIN_BUDGET_H_
