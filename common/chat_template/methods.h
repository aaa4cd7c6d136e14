// The Python methods of strings and dicts that chat templates call, and Jinja's global functions
// as Hugging Face provides them. No I/O but the clock (strftime_now). Thread-safe.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_METHODS_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_METHODS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat_template/value.h"

namespace lamina::jinja {

// `object.name(args)` for a string or dict. NotFound when `object` has no such method.
absl::StatusOr<Value> CallMethod(const Value& object, const std::string& name, const CallArgs& args);

// raise_exception(message), namespace(...), range(...), strftime_now(format) and dict(...).
// raise_exception fails with FailedPrecondition whose message is the template's.
ValueDict GlobalFunctions();

}  // namespace lamina::jinja

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_METHODS_H_
