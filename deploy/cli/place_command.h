// `lamina place`: a topology's hosts mapped onto given machines (those a scheduler allocated).
#ifndef LAMINA_DEPLOY_CLI_PLACE_COMMAND_H_
#define LAMINA_DEPLOY_CLI_PLACE_COMMAND_H_

#include <string>
#include <vector>

namespace lamina::cli {

extern const char kPlaceUsage[];
int RunPlace(const std::vector<std::string>& args);

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_PLACE_COMMAND_H_
