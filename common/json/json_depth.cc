#include "common/json/json_depth.h"

#include "absl/strings/str_cat.h"

namespace lamina {

absl::Status CheckJsonNesting(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat("JSON nested deeper than ", max_depth, " levels (at byte ", i,
                                                       ")"));
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace lamina
