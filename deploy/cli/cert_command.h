// `lamina cert`: a self-signed certificate and key for a coordinator's TLS (`coordinator.tls`).
#ifndef LAMINA_DEPLOY_CLI_CERT_COMMAND_H_
#define LAMINA_DEPLOY_CLI_CERT_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kCertUsage[];
int RunCert(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_CERT_COMMAND_H_
