#include "coordinator/cluster/membership.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace lamina {

namespace {

// Averages over the last few reports: each new difference weighs half.
double Blend(double average, double sample) { return average > 0 ? 0.5 * average + 0.5 * sample : sample; }

}  // namespace

void Membership::UpdateRates(const lamina::v1::NodeLoad& before, const lamina::v1::NodeLoad& now, MemberInfo* m) {
  const int64_t rows = now.attended_rows() - before.attended_rows();
  const double attending = now.attention_seconds() - before.attention_seconds();
  if (rows > 0 && attending >= 0) m->row_attention_seconds = Blend(m->row_attention_seconds, attending / rows);
  const int64_t steps = now.busy_count() - before.busy_count();
  const double computing = now.busy_seconds() - before.busy_seconds();
  if (m->spec.kind == NodeKind::kCompute && steps > 0 && computing >= 0) {
    m->step_compute_seconds = Blend(m->step_compute_seconds, computing / steps);
  }
}

Membership::Membership(const Topology& topology, DeathCallback on_death)
    : timeout_(absl::Milliseconds(topology.heartbeat_timeout_ms)), on_death_(std::move(on_death)) {
  for (const NodeSpec& spec : topology.nodes) {
    MemberInfo& m = members_[spec.name];
    m.spec = spec;
    m.kv_capacity_slots = spec.kv_capacity_tokens;
    m.kv_free_slots = spec.kv_capacity_tokens;
  }
  monitor_ = std::thread([this] { Monitor(); });
}

Membership::~Membership() { Stop(); }

void Membership::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

absl::Status Membership::Register(const lamina::v1::RegisterRequest& request) {
  absl::Status status = RegisterLocked(request);
  if (status.ok()) NotifyServing();
  return status;
}

absl::Status Membership::RegisterLocked(const lamina::v1::RegisterRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(request.name());
  if (it == members_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("node '", request.name(), "' is not in the topology"));
  }
  const bool memory = it->second.spec.kind == NodeKind::kMemory;
  if (request.role() != (memory ? lamina::v1::NODE_ROLE_MEMORY : lamina::v1::NODE_ROLE_COMPUTE)) {
    return absl::InvalidArgumentError(absl::StrCat("node '", request.name(), "' has the wrong role"));
  }
  MemberInfo& m = it->second;
  m.registered = true;
  m.dead = false;
  m.dead_reason.clear();
  m.last_heard = absl::Now();
  m.load.Clear();  // a restarted node counts from zero again
  m.pid = request.pid();
  if (m.spec.holds_kv()) {  // a memory node, or a compute node with a pool of its own
    m.kv_capacity_slots = request.kv_capacity_slots();
    m.kv_free_slots = request.kv_capacity_slots();
    m.num_sequences = 0;
  }
  return absl::OkStatus();
}

bool Membership::Heartbeat(const lamina::v1::HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(request.name());
  if (it == members_.end() || !it->second.alive()) return false;
  MemberInfo& m = it->second;
  m.last_heard = absl::Now();
  UpdateRates(m.load, request.load(), &m);
  m.load = request.load();
  if (m.spec.holds_kv()) {
    m.kv_free_slots = request.kv_free_slots();
    m.num_sequences = request.num_sequences();
    m.kv_shared_slots = request.kv_shared_slots();
  }
  return true;
}

void Membership::MarkDead(const std::string& node, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    auto it = members_.find(node);
    if (it == members_.end() || it->second.dead) return;
    it->second.dead = true;
    it->second.dead_reason = why;
  }
  NotifyServing();
  if (on_death_) on_death_(node, why);
}

void Membership::SetServingListener(std::function<void(bool can_serve)> listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  serving_listener_ = std::move(listener);
  if (serving_listener_) serving_listener_(CanServe());
}

void Membership::NotifyServing() {
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (serving_listener_) serving_listener_(CanServe());
}

void Membership::SetKvUse(const std::string& node, int64_t free_slots, int64_t num_sequences) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(node);
  if (it == members_.end()) return;
  it->second.kv_free_slots = free_slots;
  it->second.num_sequences = num_sequences;
}

bool Membership::IsAlive(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = members_.find(node);
  return it != members_.end() && it->second.alive();
}

std::vector<MemberInfo> Membership::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MemberInfo> out;
  for (const auto& [name, m] : members_) out.push_back(m);
  return out;
}

bool Membership::AllAlive(std::string* why) const {
  std::vector<std::string> problems;
  for (const MemberInfo& m : Snapshot()) {
    if (!m.registered) problems.push_back(m.spec.name + " (host " + m.spec.host + ") not registered");
    else if (m.dead) problems.push_back(m.spec.name + " dead: " + m.dead_reason);
  }
  if (why) *why = absl::StrJoin(problems, "; ");
  return problems.empty();
}

bool Membership::CanServe() const {
  bool memory_alive = false;
  for (const MemberInfo& m : Snapshot()) memory_alive |= m.alive() && m.spec.kind == NodeKind::kMemory;
  for (const MemberInfo& m : Snapshot()) {
    if (m.alive() && m.spec.kind == NodeKind::kCompute && (memory_alive || m.spec.holds_kv())) return true;
  }
  return false;
}

void Membership::Monitor() {
  for (;;) {
    std::vector<std::pair<std::string, std::string>> deaths;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (const auto& [name, m] : members_) {
        if (m.alive() && now - m.last_heard > timeout_) {
          deaths.emplace_back(name, absl::StrFormat("no heartbeat for %.1f s", absl::ToDoubleSeconds(now - m.last_heard)));
        }
      }
    }
    for (const auto& [name, why] : deaths) MarkDead(name, why);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace lamina
