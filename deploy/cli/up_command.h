// `lamina up TOPOLOGY.yaml`: validates the topology, starts every process of it, waits until the
// cluster is healthy, prints the endpoint, supervises (reports a daemon that dies), and on Ctrl-C
// or SIGTERM stops everything (SIGTERM, then SIGKILL after a grace period). Children die with it
// even if it is killed outright (PR_SET_PDEATHSIG), so no process is left behind.
#ifndef LAMINA_DEPLOY_CLI_UP_COMMAND_H_
#define LAMINA_DEPLOY_CLI_UP_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kUpUsage[];
int RunUp(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_UP_COMMAND_H_
