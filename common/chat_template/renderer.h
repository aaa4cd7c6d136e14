// Renders a parsed Jinja template with a set of variables, as Jinja's sandbox does for Hugging
// Face chat templates: undefined names print nothing and are false, looking into one fails; a
// `set` inside a loop's body lasts for that pass only (namespace() carries values out); the global
// functions of methods.h are there unless a variable hides them.
//
// Errors name the template's line: InvalidArgument for a template that cannot run (an unknown
// filter, adding a string to a number, ...), FailedPrecondition for the template's own
// raise_exception (its message kept). Rendering is bounded: macro calls nest at most 64 deep, the
// output may not pass 64 MiB, and a render takes at most 5 million steps (nodes, expressions, loop passes).
// Each call is independent; thread-safe.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_RENDERER_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_RENDERER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat_template/parser.h"
#include "common/chat_template/value.h"

namespace lamina::jinja {

absl::StatusOr<std::string> Render(const Body& body, const ValueDict& variables);

}  // namespace lamina::jinja

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_RENDERER_H_
