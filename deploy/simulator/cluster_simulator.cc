#include "deploy/simulator/cluster_simulator.h"

#include <algorithm>
#include <deque>
#include <queue>

#include "coordinator/scheduler/prefill_budget.h"

namespace lamina::simulator {
namespace {

struct Sequence {
  int request = 0;
  int prompt = 0;
  int output = 0;
  int prefilled = 0;  // prompt tokens prefilled by the iterations that ended
  int chunk = 0;      // prompt tokens the iteration in flight prefills
  int generated = 0;  // 0 until its prompt's last prefill iteration ends
};

// One batch in flight: its sequences and whether an iteration of it runs.
struct BatchLoop {
  std::vector<Sequence> running;
  bool busy = false;
};

struct Replica {
  std::vector<BatchLoop> batches;  // CostModel::batches, sharing the replica's memory nodes
  int64_t kv_used = 0;
  double busy_ms = 0, attention_ms = 0;
  int64_t iterations = 0, decoded = 0;
};

struct Event {
  double t_ms;
  int replica;  // -1: an arrival
  int batch;
  bool operator>(const Event& o) const { return t_ms > o.t_ms; }
};

}  // namespace

SimulationResult Simulate(const CostModel& costs, const ClusterShape& shape, const bench::WorkloadSpec& workload,
                          const std::vector<bench::BenchRequest>& requests) {
  const int n = static_cast<int>(requests.size());
  std::vector<double> arrival(n, 0), first(n, -1), done(n, -1);
  std::vector<int> prompt_len(n), output_len(n);
  for (int i = 0; i < n; ++i) {
    prompt_len[i] = std::max<int>(1, requests[i].prompt_ids.empty() ? 1 : static_cast<int>(requests[i].prompt_ids.size()));
    output_len[i] = requests[i].output_tokens;
  }
  const int batches = std::max(1, costs.batches);
  std::vector<Replica> replicas(shape.replicas);
  for (Replica& rep : replicas) rep.batches.resize(batches);
  std::deque<int> waiting;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  int released = 0;
  const bool closed = workload.mode == bench::ArrivalMode::kClosedLoop;
  if (closed) {
    for (; released < std::min(n, workload.concurrency); ++released) waiting.push_back(released);
  } else {
    for (int i = 0; i < n; ++i) {
      arrival[i] = 1e3 * requests[i].arrival_s;
      events.push({arrival[i], -1, 0});
    }
  }
  const int64_t kv_capacity = costs.kv_capacity_tokens * shape.memory_nodes_per_replica;
  double coordinator_free = 0, coordinator_busy = 0;
  int64_t admissions_tried = 0, kv_blocked = 0;
  int next_arrival = 0;

  auto try_start = [&](int r, int b, double now) {
    Replica& rep = replicas[r];
    BatchLoop& loop = rep.batches[b];
    if (loop.busy || (loop.running.empty() && waiting.empty())) return;
    const double start = std::max(now, coordinator_free);
    // Like the scheduler, each batch takes up to its equal share of what runs or waits; under
    // `auto`, the batches after the first take none while few do.
    int64_t pending = static_cast<int64_t>(waiting.size());
    for (const BatchLoop& other : rep.batches) pending += static_cast<int64_t>(other.running.size());
    const int64_t sharing =
        batches > 1 && costs.more_batches_above >= 0 && pending <= costs.more_batches_above ? 1 : batches;
    const int64_t limit = b > 0 && sharing == 1 ? 0 : std::min(shape.max_batch, (pending + sharing - 1) / sharing);
    // Admit like the scheduler: batch limit, token budget, KV room. With chunked prefill a prompt
    // joins while any budget is left (or none is being prefilled) and is prefilled as the budget
    // allows; without, it must fit what is left, unless it runs alone.
    int64_t budget = costs.max_tokens_per_iteration;
    bool prefilling = false;
    for (const Sequence& s : loop.running) {
      budget -= s.generated > 0 ? 1 : s.prompt - s.prefilled;
      prefilling |= s.generated == 0;
    }
    bool admitted = false;
    while (!waiting.empty() && static_cast<int64_t>(loop.running.size()) < limit) {
      const int q = waiting.front();
      const int64_t need = prompt_len[q] + output_len[q];
      ++admissions_tried;
      if (rep.kv_used + need > kv_capacity) {
        ++kv_blocked;
        break;
      }
      if (costs.chunked_prefill ? budget <= 0 && (prefilling || admitted)
                                : prompt_len[q] > budget && !loop.running.empty()) {
        break;
      }
      waiting.pop_front();
      rep.kv_used += need;
      budget -= prompt_len[q];
      admitted = true;
      loop.running.push_back({q, prompt_len[q], output_len[q], 0, 0, 0});
    }
    double batch = 0, attended = 0;
    for (const Sequence& s : loop.running) {
      if (s.generated == 0) continue;
      batch += 1;
      attended += s.prompt + s.generated;
    }
    // The prompts' share: what the decodes leave, in admission order.
    PrefillBudget prompts(costs.max_tokens_per_iteration, static_cast<int64_t>(batch), costs.chunked_prefill);
    int64_t prefill_tokens = 0;
    for (Sequence& s : loop.running) {
      if (s.generated > 0) continue;
      s.chunk = static_cast<int>(prompts.Take(s.prompt - s.prefilled));
      prefill_tokens += s.chunk;
    }
    if (batch == 0 && prefill_tokens == 0) return;  // nothing fits yet: wait for a finish
    const double ms = costs.IterationMs(batch, attended, static_cast<double>(prefill_tokens),
                                        shape.memory_nodes_per_replica);
    coordinator_free = start + costs.coordinator_ms;
    coordinator_busy += costs.coordinator_ms;
    loop.busy = true;
    rep.busy_ms += ms;
    rep.attention_ms += costs.AttentionMs(attended, shape.memory_nodes_per_replica);
    ++rep.iterations;
    rep.decoded += static_cast<int64_t>(batch);
    events.push({start + costs.coordinator_ms + ms, r, b});
  };

  // An iteration ends: every sequence of it gains a token; finished ones free their KV and, in a
  // closed loop, let the next request in.
  auto finish_iteration = [&](int r, int b, double now) {
    Replica& rep = replicas[r];
    BatchLoop& loop = rep.batches[b];
    loop.busy = false;
    std::vector<Sequence> still;
    for (Sequence& s : loop.running) {
      if (s.generated == 0) {
        s.prefilled += s.chunk;
        s.chunk = 0;
        if (s.prefilled < s.prompt) {  // a chunk short of the prompt's end, or none
          still.push_back(s);
          continue;
        }
      }
      ++s.generated;
      if (s.generated == 1) first[s.request] = now;
      if (s.generated < s.output) {
        still.push_back(s);
        continue;
      }
      done[s.request] = now;
      rep.kv_used -= s.prompt + s.output;
      if (closed && released < n) {
        arrival[released] = now;
        waiting.push_back(released++);
      }
    }
    loop.running.swap(still);
  };
  auto try_start_all = [&](double now) {
    for (int r = 0; r < shape.replicas; ++r) {
      for (int b = 0; b < batches; ++b) try_start(r, b, now);
    }
  };

  double now = 0;
  try_start_all(now);
  // Ends when nothing is scheduled: every request done, or the rest can never fit.
  while (!events.empty()) {
    const Event e = events.top();
    events.pop();
    now = e.t_ms;
    if (e.replica < 0) {
      waiting.push_back(next_arrival++);
    } else {
      finish_iteration(e.replica, e.batch, now);
    }
    try_start_all(now);
  }

  SimulationResult result;
  result.requests = n;
  result.wall_s = now / 1e3;
  std::vector<double> ttft, tpot;
  for (int i = 0; i < n; ++i) {
    if (done[i] < 0) continue;
    result.output_tokens += output_len[i];
    ttft.push_back(first[i] - arrival[i]);
    if (output_len[i] > 1) tpot.push_back((done[i] - first[i]) / (output_len[i] - 1));
  }
  result.ttft_ms = bench::Summarize(ttft);
  result.tpot_ms = bench::Summarize(tpot);
  if (result.wall_s > 0) result.output_tokens_per_s = result.output_tokens / result.wall_s;
  double busy = 0, attention = 0;
  int64_t iterations = 0, decoded = 0;
  for (const Replica& r : replicas) {
    busy += r.busy_ms;
    attention += r.attention_ms;
    iterations += r.iterations;
    decoded += r.decoded;
  }
  if (now > 0) {
    result.compute_busy = busy / (shape.replicas * batches) / now;
    result.coordinator_busy = coordinator_busy / now;
  }
  if (busy > 0) result.attention_share = attention / busy;
  if (admissions_tried > 0) result.kv_blocked = static_cast<double>(kv_blocked) / admissions_tried;
  if (iterations > 0) result.mean_batch = static_cast<double>(decoded) / iterations;
  if (result.coordinator_busy > 0.8) {
    result.bottleneck = "coordinator (its serial work per iteration)";
  } else if (result.kv_blocked > 0.25) {
    result.bottleneck = "KV capacity (admissions wait for memory)";
  } else if (result.compute_busy < 0.5) {
    result.bottleneck = "load (the cluster idles)";
  } else if (result.attention_share > 0.5) {
    result.bottleneck = "memory nodes (attention)";
  } else {
    result.bottleneck = "compute nodes";
  }
  return result;
}

}  // namespace lamina::simulator
