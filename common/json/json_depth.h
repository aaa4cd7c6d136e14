// Bounds a JSON text's nesting before a parser sees it: parsers, and the destructors of the trees
// they build, recurse once per level, so 100,000 '[' in a request body would crash a server.
// Thread-safe: a pure function.
#ifndef LAMINA_COMMON_JSON_JSON_DEPTH_H_
#define LAMINA_COMMON_JSON_JSON_DEPTH_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lamina {

// InvalidArgument, saying where, when arrays and objects nest deeper than `max_depth` in `text`
// (brackets inside strings, escapes included, do not count). Reads each byte once, keeping no
// stack; malformed JSON is left for the parser to refuse.
absl::Status CheckJsonNesting(absl::string_view text, int max_depth);

}  // namespace lamina

#endif  // LAMINA_COMMON_JSON_JSON_DEPTH_H_
