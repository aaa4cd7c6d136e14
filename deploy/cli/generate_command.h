// `lamina generate`: single-process generation from a Hugging Face model folder.
#ifndef LAMINA_DEPLOY_CLI_GENERATE_COMMAND_H_
#define LAMINA_DEPLOY_CLI_GENERATE_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

// Runs the command with the arguments after "generate"; returns the process exit code
// (0 success, 1 failure, 2 bad usage). Output text goes to stdout, errors to stderr.
int RunGenerate(const std::vector<std::string>& args);

extern const char kGenerateUsage[];

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_GENERATE_COMMAND_H_
