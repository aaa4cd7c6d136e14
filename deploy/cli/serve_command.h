// `lamina serve`: one command that serves a model folder (no topology to write): a coordinator and
// one compute node with its own KV pool, sized from the device's memory (deploy/serve/serve_plan.h).
#ifndef LAMINA_DEPLOY_CLI_SERVE_COMMAND_H_
#define LAMINA_DEPLOY_CLI_SERVE_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kServeUsage[];
int RunServe(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_SERVE_COMMAND_H_
