// A client request as the scheduler sees it, and the channel its results travel back on.
#ifndef LAMINA_COORDINATOR_SCHEDULER_REQUEST_H_
#define LAMINA_COORDINATOR_SCHEDULER_REQUEST_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "compute_node/sampling/sampler.h"
#include "coordinator/sequence/stop_conditions.h"
#include "lamina/v1/generation.pb.h"

namespace lamina {

struct GenerationSpec {
  std::vector<int32_t> prompt;
  int32_t n = 1;  // samples from the prompt; sample k uses seed + k
  SamplingParams sampling;
  StopConditions stop;
  std::vector<std::string> stop_strings;
};

// Tokens and text one sample produced since its previous event. A sample's last event has a finish
// reason; the request's last event has `done` set. An error ends the whole request (done, error).
struct RequestEvent {
  int32_t index = 0;  // the sample
  std::vector<int32_t> token_ids;
  // One per token id, when the request asked: as the compute node sent them (no token text).
  std::vector<lamina::v1::TokenLogprobs> logprobs;
  std::string text;
  bool done = false;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
};

// Shared by the API handler (which pops events and may cancel) and the scheduler (which pushes).
// Thread-safe.
class RequestHandle {
 public:
  explicit RequestHandle(uint64_t id) : id_(id), submitted_(absl::Now()) {}
  uint64_t id() const { return id_; }
  absl::Time submitted() const { return submitted_; }

  void Push(RequestEvent event);
  // Waits up to `wait` for the next event; false when none came.
  bool Pop(RequestEvent* event, absl::Duration wait);

  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  const uint64_t id_;
  const absl::Time submitted_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<RequestEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_REQUEST_H_
