#include "deploy/cli/status_command.h"

#include <cstdio>
#include <optional>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "common/topology/topology.h"
#include "deploy/client/cluster_client.h"
#include "deploy/planner/pipeline_balance.h"

namespace lamina::cli {

const char kStatusUsage[] =
    "usage: lamina status (--endpoint HOST:PORT | --topology FILE) [--api-key KEY] [--tls-ca FILE | --tls]\n"
    "  Shows a running cluster's nodes, their health and KV use, the queue and tokens/s.\n";

namespace {

absl::Status Status(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(
      Flags flags, Flags::Parse(args, {"endpoint", "topology", "api-key", "tls-ca"}, {"tls"}));
  std::string endpoint = flags.String("endpoint", "");
  std::optional<Topology> topology;
  if (flags.Has("topology")) {
    LAMINA_ASSIGN_OR_RETURN(topology, LoadTopology(flags.String("topology", "")));
    if (endpoint.empty()) endpoint = topology->coordinator_address();
  }
  if (endpoint.empty()) return absl::InvalidArgumentError("--endpoint HOST:PORT or --topology FILE is required");
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ClusterClient> client,
                          ClusterClient::Connect(endpoint, AccessFromFlags(flags, topology ? &*topology : nullptr)));
  LAMINA_ASSIGN_OR_RETURN(lamina::v1::ClusterStatusResponse s, client->Status(absl::Seconds(3)));
  std::printf("cluster %s, model %s\n", endpoint.c_str(), s.model().c_str());
  std::printf("queue %lld, running %lld, %.1f tokens/s, completed %lld, failed %lld, cancelled %lld, preempted %lld\n",
              static_cast<long long>(s.queue_length()), static_cast<long long>(s.running()), s.tokens_per_second(),
              static_cast<long long>(s.completed()), static_cast<long long>(s.failed()),
              static_cast<long long>(s.cancelled()), static_cast<long long>(s.preemptions()));
  std::printf("pipelining %s, sequences per batch: %s\n", s.pipelining().c_str(),
              absl::StrJoin(s.running_per_batch(), " + ").c_str());
  if (std::optional<planner::PipelineBalance> balance = planner::MeasureBalance(s)) {
    std::printf("%s\n", balance->Describe().c_str());
  }
  std::printf("\n");
  std::printf("%-16s %-8s %-9s %-24s %5s %6s %9s %12s  %s\n", "NODE", "ROLE", "HEALTH", "KV USED / TOTAL (FREE)",
              "SEQS", "BUSY", "RTT/LAYER", "PACE", "LAST HEARD");
  for (const auto& n : s.nodes()) {
    const bool memory = n.role() == lamina::v1::NODE_ROLE_MEMORY;
    // Memory nodes, and compute nodes with a pool of their own, hold KV caches.
    const bool holds_kv = n.kv_capacity_slots() > 0;
    // Used by requests, apart from what the prefix cache keeps (given up when room is needed).
    std::string kv = holds_kv ? absl::StrFormat("%d / %d (%d)", n.kv_used_slots() - n.kv_cached_slots(),
                                                n.kv_capacity_slots(), n.kv_free_slots())
                              : "-";
    if (holds_kv && n.kv_cached_slots() > 0) kv += absl::StrFormat(", %d cached", n.kv_cached_slots());
    if (holds_kv && n.kv_shared_slots() > 0) kv += absl::StrFormat(", %d shared", n.kv_shared_slots());
    std::string seqs = holds_kv ? absl::StrFormat("%d", n.num_sequences() - n.cached_sequences()) : "-";
    std::string heard = n.last_heartbeat_ms() < 0 ? "never" : absl::StrFormat("%.1f s ago", n.last_heartbeat_ms() / 1000.0);
    // Since the node started: the share of its time spent working, and its mean round trip.
    const auto& load = n.load();
    std::string busy = load.clock_seconds() > 0 ? absl::StrFormat("%.0f%%", 100 * load.busy_seconds() / load.clock_seconds()) : "-";
    std::string rtt = load.round_trips() > 0 ? absl::StrFormat("%.0f us", 1e6 * load.round_trip_seconds() / load.round_trips()) : "-";
    // What `balanced` placement sizes memory nodes' shares by: a memory node's attention per row
    // (one token at one layer), a compute node's computing per step.
    std::string pace = "-";
    if (memory && load.attended_rows() > 0) {
      pace = absl::StrFormat("%.1f us/row", 1e6 * load.attention_seconds() / load.attended_rows());
    } else if (!memory && load.busy_count() > 0) {
      pace = absl::StrFormat("%.1f ms/step", 1e3 * load.busy_seconds() / load.busy_count());
    }
    std::printf("%-16s %-8s %-9s %-24s %5s %6s %9s %12s  %s%s%s\n", n.name().c_str(), memory ? "memory" : "compute",
                n.healthy() ? "healthy" : "DOWN", kv.c_str(), seqs.c_str(), busy.c_str(), rtt.c_str(), pace.c_str(),
                heard.c_str(), n.detail().empty() ? "" : ": ", n.detail().c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunStatus(const std::vector<std::string>& args) {
  absl::Status status = Status(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina status: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

}  // namespace lamina::cli
