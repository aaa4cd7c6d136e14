// The coordinator's /metrics page, in Prometheus's text format, for a Prometheus server (or any
// scraper that reads it) to watch a cluster. Counters only grow while the coordinator runs, except
// a node's, which restart with the node (Prometheus's rate() takes such resets in its stride).
//
// The coordinator:
//   lamina_info{model,pipelining}                   1
//   lamina_requests_waiting                          requests queued for admission
//   lamina_sequences_running                         samples being generated, all batches
//   lamina_batch_sequences{batch}                    samples in each batch in flight
//   lamina_requests_total{status}                    requests ended, by status code ("OK", "CANCELLED",
//                                                    "UNAVAILABLE", ...; refusals at submission too)
//   lamina_sequences_finished_total{reason}          samples ended well: "stop", "length", ...
//   lamina_prompt_tokens_total                       prompt tokens of admitted requests
//   lamina_prompt_tokens_cached_total                of those, shared from the prefix cache
//   lamina_prefill_tokens_total                      tokens prefilled (recomputation after preemption too)
//   lamina_generation_tokens_total                   tokens generated
//   lamina_preemptions_total, lamina_migrations_total, lamina_migrations_refused_total,
//   lamina_iterations_total, lamina_iteration_seconds_total,
//   lamina_decoded_sequences_total                   the batching loop's work (ClusterStatus's fields)
// Histograms (_bucket, _sum, _count): lamina_request_queue_time_seconds,
//   lamina_time_to_first_token_seconds, lamina_inter_token_latency_seconds,
//   lamina_request_latency_seconds, lamina_request_prompt_tokens, lamina_request_generation_tokens
//   (ServingMetrics says what each measures).
// Each node of the topology, labelled {node}:
//   lamina_node_up{node,role}                        1 while registered and not declared dead
//   lamina_node_heartbeat_age_seconds                since its last heartbeat (registered nodes)
//   lamina_kv_slots_capacity, _used, _shared         a memory node's KV pool, in token slots
//   lamina_node_sequences                            sequences a memory node holds
//   lamina_node_uptime_seconds, lamina_node_busy_seconds_total   its clock, and its busy time on it
//   lamina_node_round_trips_total, lamina_node_round_trip_seconds_total   a compute node's
//                                                    per-layer attention round trips, and their time
// Thread-compatible (a pure function of its inputs).
#ifndef LAMINA_COORDINATOR_METRICS_METRICS_PAGE_H_
#define LAMINA_COORDINATOR_METRICS_METRICS_PAGE_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/cluster/membership.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/scheduler/serving_metrics.h"

namespace lamina {

// The Content-Type the page is served with.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

struct MetricsPageInputs {
  std::string model;
  std::string pipelining;
  std::vector<MemberInfo> members;
  SchedulerStats scheduler;
  ServingMetrics::Snapshot serving;
  absl::Time now;
};

std::string RenderMetricsPage(const MetricsPageInputs& inputs);

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_METRICS_METRICS_PAGE_H_
