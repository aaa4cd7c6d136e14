// What the coordinator's requests went through, for its /metrics page: how long they waited, how
// soon their first token came and how far apart the rest came, how long they took in all, how many
// tokens they read and wrote, and how they ended. The scheduler records; any thread may Read a copy.
// Times are measured from when a request was submitted to when the coordinator handed a token to
// its stream, so they include everything a client waits for but the network to the client.
// Thread-safe.
#ifndef LAMINA_COORDINATOR_SCHEDULER_SERVING_METRICS_H_
#define LAMINA_COORDINATOR_SCHEDULER_SERVING_METRICS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics/histogram.h"

namespace lamina {

class ServingMetrics {
 public:
  struct Snapshot {
    Snapshot();
    // Seconds: submitted to admitted into a batch; submitted to the request's first token (of
    // any sample); between a sample's consecutive tokens; submitted to the request's end (only
    // requests that were accepted: refusals at submission are counted in `requests` alone).
    Histogram queue_time, time_to_first_token, inter_token_latency, request_latency;
    // Tokens a request's prompt had, and its samples generated in all (finished requests).
    Histogram request_prompt_tokens, request_generation_tokens;
    // Prompt tokens of admitted requests, those of them found in the prefix cache (not
    // recomputed), and tokens generated.
    int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
    // Requests ended, by their status code's name ("OK", "CANCELLED", "UNAVAILABLE", ...),
    // refusals at submission among them; and samples finished well, by finish reason ("stop",
    // "length", ...).
    std::map<std::string, int64_t> requests, samples;
    // Requests moved off a failed node to be recomputed elsewhere, and those refused a move (past
    // scheduler.max_migrations).
    int64_t migrations = 0, migrations_refused = 0;
  };

  // A request left the queue for a batch, `cached` of its `prompt` tokens shared from the prefix cache.
  void Admitted(absl::Duration waited, int64_t prompt, int64_t cached);
  // A token was streamed: its request's first (`first`, that long after submission), or one that
  // came `gap` after its sample's previous token (a forked sample's first token has neither).
  void Token(std::optional<absl::Duration> first, std::optional<absl::Duration> gap);
  void SampleFinished(const std::string& reason);
  // A request ended with `code` after running `since_submitted` with the given token counts.
  void RequestEnded(absl::StatusCode code, absl::Duration since_submitted, int64_t prompt, int64_t generated);
  // A request refused when submitted (never queued).
  void Refused(absl::StatusCode code);
  // A request's node failed: it moved to be recomputed elsewhere (`moved`), or it was past its
  // limit of moves.
  void Migration(bool moved);

  Snapshot Read() const;

 private:
  mutable std::mutex mu_;
  Snapshot now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_SERVING_METRICS_H_
