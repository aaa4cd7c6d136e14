#include "coordinator/metrics/metrics_page.h"

#include "absl/strings/str_cat.h"
#include "common/metrics/prometheus_text.h"

namespace lamina {
namespace {

constexpr MetricType kCounter = MetricType::kCounter;
constexpr MetricType kGauge = MetricType::kGauge;
constexpr MetricType kHistogram = MetricType::kHistogram;

void CoordinatorMetrics(const MetricsPageInputs& in, PrometheusText& out) {
  const SchedulerStats& s = in.scheduler;
  const ServingMetrics::Snapshot& m = in.serving;
  out.Family("lamina_info", kGauge, "The model served and the pipelining mode.");
  out.Sample({{"model", in.model}, {"pipelining", in.pipelining}}, 1);
  out.Single("lamina_requests_waiting", kGauge, "Requests queued for admission.", s.queued);
  out.Single("lamina_sequences_running", kGauge, "Samples being generated, in all batches.", s.running);
  out.Family("lamina_batch_sequences", kGauge, "Samples in each batch in flight.");
  for (size_t b = 0; b < s.running_per_batch.size(); ++b)
    out.Sample({{"batch", absl::StrCat(b)}}, s.running_per_batch[b]);

  out.Family("lamina_requests_total", kCounter, "Requests ended, by status code (refusals at submission too).");
  for (const auto& [status, count] : m.requests) out.Sample({{"status", status}}, count);
  out.Family("lamina_sequences_finished_total", kCounter, "Samples that ended well, by finish reason.");
  for (const auto& [reason, count] : m.samples) out.Sample({{"reason", reason}}, count);
  out.Single("lamina_prompt_tokens_total", kCounter, "Prompt tokens of admitted requests.", m.prompt_tokens);
  out.Single("lamina_prompt_tokens_cached_total", kCounter,
             "Prompt tokens of admitted requests shared from the prefix cache.", m.cached_prompt_tokens);
  out.Single("lamina_prefill_tokens_total", kCounter, "Tokens prefilled, recomputation after preemption included.",
             s.prefilled_tokens);
  out.Single("lamina_generation_tokens_total", kCounter, "Tokens generated.", m.generated_tokens);
  out.Single("lamina_preemptions_total", kCounter, "Samples preempted when a memory node ran dry.", s.preemptions);
  out.Single("lamina_migrations_total", kCounter,
             "Requests moved off a failed node and recomputed on a surviving pool.", m.migrations);
  out.Single("lamina_migrations_refused_total", kCounter,
             "Requests a failed node ended because they had moved scheduler.max_migrations times.",
             m.migrations_refused);
  out.Single("lamina_iterations_total", kCounter, "Iterations (steps) that succeeded.", s.iterations);
  out.Single("lamina_iteration_seconds_total", kCounter, "Wall time of all iterations, plan sent to result read.",
             s.iteration_seconds);
  out.Single("lamina_decoded_sequences_total", kCounter, "Sequences decoded, summed over iterations.",
             s.decoded_sequences);

  const struct {
    const char* name;
    const char* help;
    const Histogram& histogram;
  } histograms[] = {
      {"lamina_request_queue_time_seconds", "From submission to admission into a batch.", m.queue_time},
      {"lamina_time_to_first_token_seconds", "From submission to the request's first token.", m.time_to_first_token},
      {"lamina_inter_token_latency_seconds", "Between a sample's consecutive tokens.", m.inter_token_latency},
      {"lamina_request_latency_seconds", "From submission to the end of an accepted request.", m.request_latency},
      {"lamina_request_prompt_tokens", "Prompt tokens of each ended request.", m.request_prompt_tokens},
      {"lamina_request_generation_tokens", "Tokens each ended request generated, all samples.",
       m.request_generation_tokens},
  };
  for (const auto& h : histograms) {
    out.Family(h.name, kHistogram, h.help);
    out.HistogramSamples({}, h.histogram);
  }
}

void NodeMetrics(const MetricsPageInputs& in, PrometheusText& out) {
  auto each = [&](const std::string& name, MetricType type, const std::string& help, auto value_of, auto wanted) {
    out.Family(name, type, help);
    for (const MemberInfo& node : in.members) {
      if (wanted(node)) out.Sample({{"node", node.spec.name}}, value_of(node));
    }
  };
  auto registered = [](const MemberInfo& node) { return node.registered; };
  // Memory nodes, and compute nodes with a pool of their own.
  auto memory = [](const MemberInfo& node) {
    return node.registered && (node.spec.kind == NodeKind::kMemory || node.spec.holds_kv());
  };
  auto compute = [](const MemberInfo& node) { return node.registered && node.spec.kind == NodeKind::kCompute; };

  out.Family("lamina_node_up", kGauge, "1 while the node is registered and not declared dead.");
  for (const MemberInfo& node : in.members) {
    out.Sample({{"node", node.spec.name}, {"role", node.spec.kind == NodeKind::kMemory ? "memory" : "compute"}},
               node.alive() ? 1 : 0);
  }
  each(
      "lamina_node_heartbeat_age_seconds", kGauge, "Seconds since the node's last heartbeat.",
      [&](const MemberInfo& node) { return absl::ToDoubleSeconds(in.now - node.last_heard); }, registered);
  each(
      "lamina_kv_slots_capacity", kGauge, "Token slots of a node's KV pool.",
      [](const MemberInfo& node) { return node.kv_capacity_slots; }, memory);
  each(
      "lamina_kv_slots_used", kGauge, "Token slots in use.",
      [](const MemberInfo& node) { return node.kv_capacity_slots - node.kv_free_slots; }, memory);
  each(
      "lamina_kv_slots_shared", kGauge, "Token slots held by more than one sequence.",
      [](const MemberInfo& node) { return node.kv_shared_slots; }, memory);
  each(
      "lamina_node_sequences", kGauge, "Sequences a node's KV pool holds.",
      [](const MemberInfo& node) { return node.num_sequences; }, memory);
  each(
      "lamina_node_uptime_seconds", kGauge, "Seconds on the node's clock since it started, as last reported.",
      [](const MemberInfo& node) { return node.load.clock_seconds(); }, registered);
  each(
      "lamina_node_busy_seconds_total", kCounter, "Seconds the node was busy, as last reported.",
      [](const MemberInfo& node) { return node.load.busy_seconds(); }, registered);
  each(
      "lamina_node_round_trips_total", kCounter, "A compute node's per-layer attention round trips.",
      [](const MemberInfo& node) { return node.load.round_trips(); }, compute);
  each(
      "lamina_node_round_trip_seconds_total", kCounter, "Seconds of those round trips, summed.",
      [](const MemberInfo& node) { return node.load.round_trip_seconds(); }, compute);
  each(
      "lamina_node_attended_rows_total", kCounter,
      "Rows a memory node attended over the host data plane (a row: one token at one layer).",
      [](const MemberInfo& node) { return node.load.attended_rows(); }, memory);
  each(
      "lamina_node_attention_seconds_total", kCounter, "Seconds of that attention, summed.",
      [](const MemberInfo& node) { return node.load.attention_seconds(); }, memory);
}

}  // namespace

std::string RenderMetricsPage(const MetricsPageInputs& inputs) {
  PrometheusText out;
  CoordinatorMetrics(inputs, out);
  NodeMetrics(inputs, out);
  return out.text();
}

}  // namespace lamina
