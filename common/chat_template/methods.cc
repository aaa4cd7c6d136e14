#include "common/chat_template/methods.h"

#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/py_string.h"
#include "common/status/status_macros.h"

namespace lamina::jinja {
namespace {

// Large enough for any chat template's loop, small enough that a bad one cannot exhaust memory.
constexpr int64_t kMaxRange = 100000;

absl::Status Bad(std::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

const Value* Positional(const CallArgs& args, size_t i) {
  return i < args.positional.size() ? &args.positional[i] : nullptr;
}

absl::StatusOr<std::string> StringAt(const CallArgs& args, size_t i, const std::string& method) {
  const Value* v = Positional(args, i);
  if (v == nullptr || !v->is_string()) return Bad(absl::StrCat(method, "() needs a string argument"));
  return v->str();
}

// startswith/endswith take a string or a tuple (here a list) of strings.
absl::StatusOr<bool> AffixMatches(const std::string& s, const Value* affix, bool prefix, const std::string& method) {
  if (affix == nullptr) return Bad(absl::StrCat(method, "() needs an argument"));
  ValueList options = affix->is_list() ? affix->list() : ValueList{*affix};
  for (const Value& option : options) {
    if (!option.is_string()) return Bad(absl::StrCat(method, "() needs strings"));
    const std::string& a = option.str();
    if (a.size() <= s.size() &&
        (prefix ? s.compare(0, a.size(), a) : s.compare(s.size() - a.size(), a.size(), a)) == 0) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<Value> StringMethod(const std::string& s, const std::string& name, const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value(Strip(s, Positional(args, 0), name != "rstrip", name != "lstrip"));
  }
  if (name == "upper") return Value(Upper(s));
  if (name == "lower") return Value(Lower(s));
  if (name == "title") return Value(Title(s));
  if (name == "capitalize") return Value(Capitalize(s));
  if (name == "startswith" || name == "endswith") {
    LAMINA_ASSIGN_OR_RETURN(bool match, AffixMatches(s, Positional(args, 0), name == "startswith", name));
    return Value(match);
  }
  if (name == "split") {
    const Value* sep = Positional(args, 0);
    if (sep != nullptr && !sep->is_none() && (!sep->is_string() || sep->str().empty())) {
      return Bad("split() needs a nonempty string separator, or none");
    }
    const Value* max_split = Positional(args, 1);
    return Value::List(
        Split(s, Positional(args, 0), max_split != nullptr && max_split->is_integer() ? max_split->int_value() : -1));
  }
  if (name == "replace") {
    LAMINA_ASSIGN_OR_RETURN(std::string from, StringAt(args, 0, name));
    LAMINA_ASSIGN_OR_RETURN(std::string to, StringAt(args, 1, name));
    const Value* count = Positional(args, 2);
    return CheckedReplace(s, from, to, count != nullptr && count->is_integer() ? count->int_value() : -1);
  }
  if (name == "find" || name == "count") {
    LAMINA_ASSIGN_OR_RETURN(std::string needle, StringAt(args, 0, name));
    if (name == "find") {
      const size_t at = s.find(needle);
      if (at == std::string::npos) return Value(-1);
      return Value(static_cast<int64_t>(SplitCodePoints(s.substr(0, at)).size()));
    }
    if (needle.empty()) return Value(static_cast<int64_t>(SplitCodePoints(s).size()) + 1);
    int64_t n = 0;
    for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + needle.size())) ++n;
    return Value(n);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    LAMINA_ASSIGN_OR_RETURN(std::string affix, StringAt(args, 0, name));
    Value affix_value(affix);
    LAMINA_ASSIGN_OR_RETURN(bool match, AffixMatches(s, &affix_value, name == "removeprefix", name));
    if (!match) return Value(s);
    return Value(name == "removeprefix" ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
  }
  if (name == "join") {
    const Value* items = Positional(args, 0);
    if (items == nullptr) return Bad("join() needs an argument");
    LAMINA_ASSIGN_OR_RETURN(ValueList list, Iterate(*items));
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string()) return Bad("join() needs strings");
      absl::StrAppend(&out, i > 0 ? s : "", list[i].str());
      LAMINA_RETURN_IF_ERROR(CheckStringSize(out.size()));
    }
    return Value(std::move(out));
  }
  return absl::NotFoundError(absl::StrCat("a string has no method '", name, "'"));
}

absl::StatusOr<Value> DictMethod(const Value& dict, const std::string& name, const CallArgs& args) {
  if (name == "items" || name == "keys" || name == "values") {
    ValueList out;
    for (const auto& [k, v] : dict.dict()) {
      out.push_back(name == "items" ? Value::Tuple({Value(k), v}) : name == "keys" ? Value(k) : v);
    }
    return Value::List(std::move(out));
  }
  if (name == "get") {
    const Value* key = Positional(args, 0);
    if (key == nullptr) return Bad("get() needs a key");
    const Value* found = key->is_string() ? dict.Find(key->str()) : nullptr;
    if (found != nullptr) return *found;
    const Value* fallback = Positional(args, 1);
    return fallback != nullptr ? *fallback : Value::None();
  }
  return absl::NotFoundError(absl::StrCat("a ", dict.TypeName(), " has no method '", name, "'"));
}

ValueDict NamedToDict(const CallArgs& args) {
  ValueDict fields;
  if (!args.positional.empty() && args.positional[0].is_dict()) fields = args.positional[0].dict();
  for (const auto& [k, v] : args.named) fields.emplace_back(k, v);
  return fields;
}

absl::StatusOr<Value> Range(const CallArgs& args) {
  int64_t bounds[3] = {0, 0, 1};
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) return Bad("range() takes 1 to 3 integers");
  for (size_t i = 0; i < n; ++i) {
    if (!args.positional[i].is_integer()) return Bad("range() takes integers");
  }
  if (n == 1) {
    bounds[1] = args.positional[0].int_value();
  } else {
    for (size_t i = 0; i < n; ++i) bounds[i] = args.positional[i].int_value();
  }
  if (bounds[2] == 0) return Bad("range()'s step must not be zero");
  ValueList out;
  for (int64_t i = bounds[0]; bounds[2] > 0 ? i < bounds[1] : i > bounds[1]; i += bounds[2]) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) return Bad(absl::StrCat("range() is over ", kMaxRange, " long"));
    out.emplace_back(i);
  }
  return Value::List(std::move(out));
}

}  // namespace

absl::StatusOr<Value> CallMethod(const Value& object, const std::string& name, const CallArgs& args) {
  if (object.is_string()) return StringMethod(object.str(), name, args);
  if (object.is_dict()) return DictMethod(object, name, args);
  return absl::NotFoundError(absl::StrCat("a ", object.TypeName(), " has no method '", name, "'"));
}

ValueDict GlobalFunctions() {
  ValueDict globals;
  globals.emplace_back("raise_exception",
                       Value::Callable("raise_exception", [](const CallArgs& args) -> absl::StatusOr<Value> {
                         const std::string message = args.positional.empty() ? "" : args.positional[0].ToString();
                         return absl::FailedPreconditionError(message);
                       }));
  globals.emplace_back("namespace", Value::Callable("namespace", [](const CallArgs& args) -> absl::StatusOr<Value> {
                         return Value::Namespace(NamedToDict(args));
                       }));
  globals.emplace_back("dict", Value::Callable("dict", [](const CallArgs& args) -> absl::StatusOr<Value> {
                         return Value::Dict(NamedToDict(args));
                       }));
  globals.emplace_back("range", Value::Callable("range", Range));
  globals.emplace_back("strftime_now",
                       Value::Callable("strftime_now", [](const CallArgs& args) -> absl::StatusOr<Value> {
                         if (args.positional.empty() || !args.positional[0].is_string())
                           return Bad("strftime_now() needs a format");
                         const std::time_t now = std::time(nullptr);
                         std::tm local{};
                         localtime_r(&now, &local);
                         char buf[256];
                         const size_t n = std::strftime(buf, sizeof(buf), args.positional[0].str().c_str(), &local);
                         return Value(std::string(buf, n));
                       }));
  return globals;
}

}  // namespace lamina::jinja
