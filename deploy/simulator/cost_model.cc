#include "deploy/simulator/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status/status_macros.h"
#include "common/yaml/yaml_fields.h"

namespace lamina::simulator {
namespace {

constexpr int kTerms = 4;  // fixed, per sequence, per attended token, per prefill token

std::array<double, kTerms> Features(const CalibrationPoint& p) {
  return {1.0, p.batch, p.batch * p.context / 1000.0, p.prefill_tokens};
}

// Solves the normal equations over the `active` terms (the others stay 0); false when singular.
bool SolveLeastSquares(const std::vector<CalibrationPoint>& points, const std::array<bool, kTerms>& active,
                       std::array<double, kTerms>* x) {
  std::vector<int> idx;
  for (int i = 0; i < kTerms; ++i) {
    if (active[i]) idx.push_back(i);
  }
  const int n = static_cast<int>(idx.size());
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0));
  for (const CalibrationPoint& p : points) {
    const auto f = Features(p);
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < n; ++c) a[r][c] += f[idx[r]] * f[idx[c]];
      a[r][n] += f[idx[r]] * p.iteration_ms;
    }
  }
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    if (std::fabs(a[pivot][col]) < 1e-12) return false;
    std::swap(a[col], a[pivot]);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double k = a[r][col] / a[col][col];
      for (int c = col; c <= n; ++c) a[r][c] -= k * a[col][c];
    }
  }
  x->fill(0);
  for (int r = 0; r < n; ++r) (*x)[idx[r]] = a[r][n] / a[r][r];
  return true;
}

}  // namespace

double CostModel::AttentionMs(double attended_tokens, int nodes) const {
  return attended_tokens / 1000.0 * attention_per_ktoken_ms * memory_nodes / std::max(1, nodes);
}

double CostModel::IterationMs(double batch, double attended_tokens, double prefill_tokens, int nodes) const {
  return step_fixed_ms + batch * step_per_sequence_ms + AttentionMs(attended_tokens, nodes) +
         prefill_tokens * prefill_per_token_ms;
}

double PredictIterationMs(const CostModel& costs, const CalibrationPoint& p) {
  return costs.IterationMs(p.batch, p.batch * p.context, p.prefill_tokens, costs.memory_nodes);
}

absl::StatusOr<CostModel> FitCostModel(const std::vector<CalibrationPoint>& points, int memory_nodes,
                                       int64_t kv_capacity_tokens, const std::string& source) {
  if (points.size() < 2) return absl::InvalidArgumentError("fitting costs needs at least two measured runs");
  // Active set: drop the most negative coefficient (or a term the points cannot tell apart) until
  // every coefficient is non-negative.
  std::array<bool, kTerms> active = {true, true, true, true};
  std::array<double, kTerms> x{};
  for (int round = 0; round < kTerms; ++round) {
    if (!SolveLeastSquares(points, active, &x)) {
      for (int i = kTerms - 1; i >= 0; --i) {
        if (active[i]) {
          active[i] = false;
          break;
        }
      }
      continue;
    }
    int worst = -1;
    for (int i = 0; i < kTerms; ++i) {
      if (active[i] && x[i] < 0 && (worst < 0 || x[i] < x[worst])) worst = i;
    }
    if (worst < 0) break;
    active[worst] = false;
    x.fill(0);
  }
  CostModel costs;
  costs.step_fixed_ms = std::max(0.0, x[0]);
  costs.step_per_sequence_ms = std::max(0.0, x[1]);
  costs.attention_per_ktoken_ms = std::max(0.0, x[2]);
  costs.prefill_per_token_ms = std::max(0.0, x[3]);
  double gap = 0;
  for (const CalibrationPoint& p : points) gap += std::max(0.0, p.period_ms - p.iteration_ms);
  costs.coordinator_ms = gap / points.size();
  costs.memory_nodes = memory_nodes;
  costs.kv_capacity_tokens = kv_capacity_tokens;
  costs.source = source;
  return costs;
}

std::string CostModelToYaml(const CostModel& c) {
  return absl::StrFormat(
      "# Per-operation costs for `lamina simulate`, fitted from %s.\n"
      "step_fixed_ms: %.6g\nstep_per_sequence_ms: %.6g\nattention_per_ktoken_ms: %.6g\nprefill_per_token_ms: %.6g\n"
      "coordinator_ms: %.6g\nmemory_nodes: %d\nkv_capacity_tokens: %d\nmax_tokens_per_iteration: %d\n"
      "chunked_prefill: %s\nbatches: %d\nmore_batches_above: %d\n",
      c.source, c.step_fixed_ms, c.step_per_sequence_ms, c.attention_per_ktoken_ms, c.prefill_per_token_ms,
      c.coordinator_ms, c.memory_nodes, c.kv_capacity_tokens, c.max_tokens_per_iteration,
      c.chunked_prefill ? "true" : "false", c.batches, c.more_batches_above);
}

absl::StatusOr<CostModel> LoadCostModel(const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  YamlFields f(root, path, "",
               {"step_fixed_ms", "step_per_sequence_ms", "attention_per_ktoken_ms", "prefill_per_token_ms",
                "coordinator_ms", "memory_nodes", "kv_capacity_tokens", "max_tokens_per_iteration", "chunked_prefill",
                "batches", "more_batches_above"});
  LAMINA_RETURN_IF_ERROR(f.CheckShape());
  CostModel c;
  c.source = path;
  LAMINA_ASSIGN_OR_RETURN(c.step_fixed_ms, f.Double("step_fixed_ms", nullptr, 0, 1e9));
  LAMINA_ASSIGN_OR_RETURN(c.step_per_sequence_ms, f.Double("step_per_sequence_ms", nullptr, 0, 1e9));
  LAMINA_ASSIGN_OR_RETURN(c.attention_per_ktoken_ms, f.Double("attention_per_ktoken_ms", nullptr, 0, 1e9));
  LAMINA_ASSIGN_OR_RETURN(c.prefill_per_token_ms, f.Double("prefill_per_token_ms", nullptr, 0, 1e9));
  LAMINA_ASSIGN_OR_RETURN(c.coordinator_ms, f.Double("coordinator_ms", nullptr, 0, 1e9));
  LAMINA_ASSIGN_OR_RETURN(int64_t nodes, f.Integer("memory_nodes", nullptr, 1, 1 << 20));
  LAMINA_ASSIGN_OR_RETURN(c.kv_capacity_tokens, f.Integer("kv_capacity_tokens", nullptr, 1, int64_t{1} << 40));
  const int64_t budget = c.max_tokens_per_iteration;
  LAMINA_ASSIGN_OR_RETURN(c.max_tokens_per_iteration, f.Integer("max_tokens_per_iteration", &budget, 1, 1 << 30));
  LAMINA_ASSIGN_OR_RETURN(c.chunked_prefill, f.Bool("chunked_prefill", true));
  const int64_t one = 1, always = -1;
  LAMINA_ASSIGN_OR_RETURN(const int64_t batches, f.Integer("batches", &one, 1, 64));
  LAMINA_ASSIGN_OR_RETURN(c.more_batches_above, f.Integer("more_batches_above", &always, -1, int64_t{1} << 30));
  c.batches = static_cast<int>(batches);
  c.memory_nodes = static_cast<int>(nodes);
  return c;
}

}  // namespace lamina::simulator
