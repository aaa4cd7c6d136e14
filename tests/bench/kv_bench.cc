// lamina-bench-kv: the memory node's token-granular slot allocator against a 16-token paged
// allocator (the vLLM-style baseline), measured in the same run on the same serving trace.
//   - speed: token appends and sequence frees per second;
//   - waste: slots held beyond the tokens stored (internal fragmentation), averaged over the trace.
// The trace: sequences arrive with prompt and output lengths drawn from a mixed distribution
// (log-normal, 16 to 4096 prompt tokens, 16 to 1024 output tokens), grow one token per step and
// leave when done, with the pool kept near full.
// Usage: lamina-bench-kv [--slots N] [--sequences N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kv/cache/slot_allocator.h"

namespace lamina {
namespace {

using Clock = std::chrono::steady_clock;

struct SequenceSpec {
  int64_t prompt;
  int64_t output;
};

std::vector<SequenceSpec> MakeTrace(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> prompt(std::log(300.0), 1.0), output(std::log(120.0), 0.9);
  std::vector<SequenceSpec> trace;
  for (int i = 0; i < count; ++i) {
    trace.push_back({std::clamp<int64_t>(static_cast<int64_t>(prompt(rng)), 16, 4096),
                     std::clamp<int64_t>(static_cast<int64_t>(output(rng)), 16, 1024)});
  }
  return trace;
}

// The baseline: pages of 16 slots from a LIFO free list; a sequence holds whole pages.
class PagedAllocator {
 public:
  static constexpr int64_t kPage = 16;
  explicit PagedAllocator(int64_t slots) {
    for (int64_t p = slots / kPage - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
  }
  // Grows a sequence holding `pages` (for `tokens` tokens) by `count` tokens.
  bool Append(std::vector<int32_t>* pages, int64_t tokens, int64_t count) {
    const int64_t need = (tokens + count + kPage - 1) / kPage - static_cast<int64_t>(pages->size());
    if (need > static_cast<int64_t>(free_.size())) return false;
    for (int64_t i = 0; i < need; ++i) {
      pages->push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  void Free(const std::vector<int32_t>& pages) {
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) free_.push_back(*it);
  }

 private:
  std::vector<int32_t> free_;
};

struct Result {
  double seconds = 0;
  int64_t appends = 0;    // tokens appended (prompt tokens count one each)
  int64_t frees = 0;      // sequences freed
  double waste = 0;       // average fraction of held slots that hold no token
  int64_t completed = 0;  // sequences that ran to the end
  int64_t peak_running = 0;  // most sequences resident at once
};

// Runs the trace: admit while the pool can hold the next sequence at its final length (in the
// allocator's own unit: `footprint` slots), then grow every running sequence by one token per
// step until it is done. Admission by final size means growth never fails.
template <typename Holder, typename AppendFn, typename FreeFn, typename HeldFn, typename FootprintFn>
Result Run(const std::vector<SequenceSpec>& trace, int64_t capacity, AppendFn append, FreeFn free_seq, HeldFn held,
           FootprintFn footprint) {
  struct Running {
    SequenceSpec spec;
    int64_t tokens = 0;
    Holder holder;
  };
  Result r;
  std::vector<Running> running;
  size_t next = 0;
  double waste_sum = 0;
  int64_t waste_samples = 0;
  int64_t committed = 0;
  auto start = Clock::now();
  while (next < trace.size() || !running.empty()) {
    while (next < trace.size()) {
      const int64_t need = footprint(trace[next].prompt + trace[next].output);
      if (committed + need > capacity) break;
      Running seq{trace[next], 0, {}};
      if (!append(&seq.holder, 0, seq.spec.prompt)) break;
      committed += need;
      seq.tokens = seq.spec.prompt;
      r.appends += seq.spec.prompt;
      running.push_back(std::move(seq));
      ++next;
    }
    r.peak_running = std::max<int64_t>(r.peak_running, static_cast<int64_t>(running.size()));
    int64_t tokens = 0, slots = 0;
    for (size_t i = 0; i < running.size();) {
      Running& seq = running[i];
      if (seq.tokens < seq.spec.prompt + seq.spec.output && append(&seq.holder, seq.tokens, 1)) {
        ++seq.tokens;
        ++r.appends;
      }
      if (seq.tokens == seq.spec.prompt + seq.spec.output) {
        committed -= footprint(seq.tokens);
        free_seq(seq.holder);
        ++r.frees;
        ++r.completed;
        running[i] = std::move(running.back());
        running.pop_back();
        continue;
      }
      tokens += seq.tokens;
      slots += held(seq.holder);
      ++i;
    }
    if (slots > 0) {
      waste_sum += 1.0 - static_cast<double>(tokens) / slots;
      ++waste_samples;
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.waste = waste_samples ? waste_sum / waste_samples : 0;
  return r;
}

int Main(int argc, char** argv) {
  int64_t slots = 1 << 18;
  int sequences = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--slots") == 0) slots = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--sequences") == 0) sequences = std::atoi(argv[i + 1]);
  }
  std::printf("lamina-bench-kv; command: ");
  for (int i = 0; i < argc; ++i) std::printf("%s ", argv[i]);
  std::printf("\n%lld slots, %d sequences (log-normal prompt ~300, output ~120 tokens)\n\n",
              static_cast<long long>(slots), sequences);
  const std::vector<SequenceSpec> trace = MakeTrace(sequences, 7);

  SlotAllocator tokens(slots);
  Result token_result = Run<std::vector<SlotId>>(
      trace, slots,
      [&](std::vector<SlotId>* held, int64_t, int64_t count) { return tokens.Allocate(count, held).ok(); },
      [&](const std::vector<SlotId>& held) { tokens.Release(held); },
      [](const std::vector<SlotId>& held) { return static_cast<int64_t>(held.size()); },
      [](int64_t n) { return n; });

  PagedAllocator pages(slots);
  Result page_result = Run<std::vector<int32_t>>(
      trace, slots, [&](std::vector<int32_t>* held, int64_t n, int64_t count) { return pages.Append(held, n, count); },
      [&](const std::vector<int32_t>& held) { pages.Free(held); },
      [](const std::vector<int32_t>& held) { return static_cast<int64_t>(held.size()) * PagedAllocator::kPage; },
      [](int64_t n) { return (n + PagedAllocator::kPage - 1) / PagedAllocator::kPage * PagedAllocator::kPage; });

  std::printf("%-22s %12s %12s %14s %16s\n", "allocator", "appends/s", "frees/s", "slots wasted", "peak sequences");
  for (const auto& [name, r] : {std::make_pair("token slots (Lamina)", token_result),
                                std::make_pair("16-token pages", page_result)}) {
    std::printf("%-22s %12.3g %12.3g %13.2f%% %16lld\n", name, r.appends / r.seconds, r.frees / r.seconds, 100 * r.waste,
                static_cast<long long>(r.peak_running));
  }
  std::printf("\ntoken slots vs pages: %.2fx the append rate; %.2f%% vs %.2f%% of held slots wasted\n",
              (token_result.appends / token_result.seconds) / (page_result.appends / page_result.seconds),
              100 * token_result.waste, 100 * page_result.waste);
  return 0;
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) { return lamina::Main(argc, argv); }
