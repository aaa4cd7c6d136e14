// `lamina status`: nodes, health, KV use, queue and throughput of a running cluster.
#ifndef LAMINA_DEPLOY_CLI_STATUS_COMMAND_H_
#define LAMINA_DEPLOY_CLI_STATUS_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kStatusUsage[];
int RunStatus(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_STATUS_COMMAND_H_
