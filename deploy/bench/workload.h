// What `lamina bench` sends: how requests arrive (closed loop at a fixed concurrency, or open loop
// with Poisson arrivals at a rate), how long prompts and outputs are (fixed, drawn from a length
// distribution such as deploy/workloads/sharegpt-like.yaml, or prompts read from a file), and the
// latency targets that define goodput. A workload file (YAML) holds the same fields; a file error
// names the file, line and field.
// Plain values; thread-compatible.
#ifndef LAMINA_DEPLOY_BENCH_WORKLOAD_H_
#define LAMINA_DEPLOY_BENCH_WORKLOAD_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::bench {

enum class ArrivalMode { kClosedLoop, kOpenLoop };

// Lengths drawn by picking a bin by weight, then a length uniformly inside it.
struct LengthBin {
  int first = 1;
  int last = 1;
  double weight = 1;
};
struct LengthDistribution {
  std::string path;
  std::string name;
  std::vector<LengthBin> prompt_tokens;
  std::vector<LengthBin> output_tokens;
};
absl::StatusOr<LengthDistribution> LoadLengthDistribution(const std::string& path);
int DrawLength(const std::vector<LengthBin>& bins, std::mt19937_64* rng);

struct WorkloadSpec {
  ArrivalMode mode = ArrivalMode::kClosedLoop;
  int concurrency = 8;        // closed loop: requests in flight
  double rate = 0;            // open loop: mean arrivals per second
  int requests = 64;          // how many to send
  int prompt_tokens = 128;    // fixed lengths, when neither `lengths` nor `prompts` is given
  int output_tokens = 64;
  std::string lengths;        // a length distribution file
  std::string prompts;        // a text file, one prompt per line (output lengths as above)
  uint64_t seed = 1;
  double ttft_target_ms = 0;  // goodput targets; 0 = none
  double tpot_target_ms = 0;
  double request_timeout_s = 600;  // a request not finished by then fails

  // Names the first bad value ("concurrency must be at least 1").
  absl::Status Validate() const;
};

// Reads a workload file; paths in it resolve against its folder.
absl::StatusOr<WorkloadSpec> LoadWorkload(const std::string& path);

// One request to send. Prompts are token ids (random, seeded) unless read from a file.
struct BenchRequest {
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;
  int output_tokens = 1;
  double arrival_s = 0;  // open loop: when to send it, from the start
};

// The requests of a workload for a model with `vocab_size` tokens and a `max_context` window:
// lengths are clipped so that prompt + output fit the window. Deterministic for a seed.
absl::StatusOr<std::vector<BenchRequest>> MakeRequests(const WorkloadSpec& spec, int vocab_size, int max_context);

}  // namespace lamina::bench

#endif  // LAMINA_DEPLOY_BENCH_WORKLOAD_H_
