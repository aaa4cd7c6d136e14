// Python's str methods that chat templates call, on UTF-8 text; case changes are ASCII only.
// Pure functions; thread-safe.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_PY_STRING_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_PY_STRING_H_

#include <cstdint>
#include <string>

#include "common/chat_template/value.h"

namespace lamina::jinja {

// str.isspace() for one ASCII character.
bool IsPySpace(char c);
// str.strip/lstrip/rstrip: `chars` (a string) or, when null or None, whitespace.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right);
std::string Lower(std::string s);
std::string Upper(std::string s);
// str.capitalize(): the first character upper case, the rest lower.
std::string Capitalize(const std::string& s);
// str.title(): a letter after a non-letter upper case, every other letter lower.
std::string Title(const std::string& s);
// str.replace(from, to, count); count < 0 replaces every one.
std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
// str.split(sep, max_split): on runs of whitespace when `sep` is null or None, else on `sep` (a
// nonempty string); max_split < 0: all.
ValueList Split(const std::string& s, const Value* sep, int64_t max_split);

}  // namespace lamina::jinja

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_PY_STRING_H_
