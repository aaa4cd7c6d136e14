// `lamina plan --model DIR --workload W [--prices P]`: ranks topologies (a compute device kind,
// colocated or with its best number of memory devices of each kind) by the analytic model's
// predicted tokens/s per dollar-hour, with the batch, step time, bottleneck and link bandwidth.
#ifndef LAMINA_DEPLOY_CLI_PLAN_COMMAND_H_
#define LAMINA_DEPLOY_CLI_PLAN_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kPlanUsage[];
int RunPlanCommand(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_PLAN_COMMAND_H_
