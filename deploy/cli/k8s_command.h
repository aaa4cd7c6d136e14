// `lamina k8s`: Kubernetes manifests for a topology (deploy/k8s/manifests.h).
#ifndef LAMINA_DEPLOY_CLI_K8S_COMMAND_H_
#define LAMINA_DEPLOY_CLI_K8S_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kK8sUsage[];
int RunK8s(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_K8S_COMMAND_H_
