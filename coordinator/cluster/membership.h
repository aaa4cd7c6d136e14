// The coordinator's view of the cluster: the nodes the topology names, whether each has
// registered and is still heard from, and what the nodes holding KV caches (memory nodes, and
// compute nodes with a pool of their own) last reported. A node silent for
// the heartbeat timeout, or reported unreachable by the compute node, is declared dead once; the
// `on_death` callback then runs (on the monitor thread or the caller's, outside the lock). A dead
// node that registers again comes back.
// Thread-safe.
#ifndef LAMINA_COORDINATOR_CLUSTER_MEMBERSHIP_H_
#define LAMINA_COORDINATOR_CLUSTER_MEMBERSHIP_H_

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/topology/topology.h"
#include "lamina/v1/cluster.pb.h"

namespace lamina {

struct MemberInfo {
  NodeSpec spec;
  bool registered = false;
  bool dead = false;
  std::string dead_reason;
  absl::Time last_heard = absl::InfinitePast();
  int64_t kv_capacity_slots = 0;
  int64_t kv_free_slots = 0;
  int64_t num_sequences = 0;
  int64_t kv_shared_slots = 0;
  int64_t pid = 0;
  lamina::v1::NodeLoad load;  // as last reported
  // Recent averages from the reports' differences (0 until two reports differ): a memory node's
  // attention time per row (one token at one layer) over the host data plane, and a compute
  // node's computing time per step.
  double row_attention_seconds = 0;
  double step_compute_seconds = 0;

  bool alive() const { return registered && !dead; }
};

class Membership {
 public:
  using DeathCallback = std::function<void(const std::string& node, const std::string& why)>;

  Membership(const Topology& topology, DeathCallback on_death);
  ~Membership();  // calls Stop()
  // Stops the monitor: no death callback runs after this returns. Idempotent.
  void Stop();

  // InvalidArgument for a name the topology does not have or the wrong role.
  absl::Status Register(const lamina::v1::RegisterRequest& request);
  // False when the node must register (again).
  bool Heartbeat(const lamina::v1::HeartbeatRequest& request);
  void MarkDead(const std::string& node, const std::string& why);
  // A memory node's load as it reported it outside a heartbeat (after a free).
  void SetKvUse(const std::string& node, int64_t free_slots, int64_t num_sequences);

  bool IsAlive(const std::string& node) const;
  std::vector<MemberInfo> Snapshot() const;
  // True when every node of the topology is alive; otherwise `why` says which are not.
  bool AllAlive(std::string* why) const;
  // Whether requests can still be served: a live compute node with a live KV pool it can use (a
  // memory node, or its own).
  bool CanServe() const;
  // Calls `listener` with CanServe() now and again after every registration and death, before
  // Register or MarkDead returns, one call at a time: what a health endpoint follows. An empty
  // listener stops the calls.
  void SetServingListener(std::function<void(bool can_serve)> listener);

 private:
  void Monitor();
  void NotifyServing();
  // Folds the differences between two load reports of `m` into its recent averages.
  static void UpdateRates(const lamina::v1::NodeLoad& before, const lamina::v1::NodeLoad& now, MemberInfo* m);
  absl::Status RegisterLocked(const lamina::v1::RegisterRequest& request);

  const absl::Duration timeout_;
  DeathCallback on_death_;
  mutable std::mutex mu_;
  std::map<std::string, MemberInfo> members_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
  std::mutex listener_mu_;  // orders listener calls; taken before mu_, never inside it
  std::function<void(bool)> serving_listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_CLUSTER_MEMBERSHIP_H_
