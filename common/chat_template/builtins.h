// Jinja's filters and tests, and the lookups and comparisons they share with the renderer, as chat
// templates use them. Each works on values only: no I/O, no state. Errors are InvalidArgument and
// name the filter, test or method; the renderer adds the line. Thread-safe.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_BUILTINS_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_BUILTINS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat_template/value.h"

namespace lamina::jinja {

// `subject | name(args)`. NotFound for a filter that does not exist.
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& subject, const CallArgs& args);

// str.replace() whose result may not pass kMaxStringBytes.
absl::StatusOr<Value> CheckedReplace(const std::string& s, const std::string& from, const std::string& to,
                                     int64_t count);

// `subject is name(args)`. NotFound for a test that does not exist.
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& subject, const CallArgs& args);

// Python's ordering of two numbers, strings or lists: negative, zero or positive.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// Python's `a in b`: a substring, a list's item, or a dict's key.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// Jinja's attribute or item lookup on a dict or list: the value, or undefined (with a hint that
// says why) when it is missing. Looking into an undefined value fails.
absl::StatusOr<Value> GetItem(const Value& object, const Value& key);

// Python's iteration: a list's items, a dict's keys, a string's characters; undefined is empty.
absl::StatusOr<ValueList> Iterate(const Value& v);

}  // namespace lamina::jinja

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_BUILTINS_H_
