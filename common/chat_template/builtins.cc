#include "common/chat_template/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/chat_template/py_string.h"
#include "common/status/status_macros.h"

namespace lamina::jinja {
namespace {

absl::Status Bad(std::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

// The argument passed by keyword as `name`, else null.
const Value* Named(const CallArgs& args, std::string_view name) {
  for (const auto& [key, value] : args.named) {
    if (key == name) return &value;
  }
  return nullptr;
}

// The argument at `index`, else the one named `name`, else null.
const Value* Arg(const CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  return Named(args, name);
}

absl::StatusOr<std::string> StringArg(const CallArgs& args, size_t index, std::string_view name,
                                      const std::string& where) {
  const Value* v = Arg(args, index, name);
  if (v == nullptr || !v->is_string()) {
    return Bad(absl::StrCat(where, " needs a string for its argument '", std::string(name), "'"));
  }
  return v->str();
}

}  // namespace

absl::StatusOr<Value> CheckedReplace(const std::string& s, const std::string& from, const std::string& to,
                                     int64_t count) {
  if (!from.empty() && to.size() > from.size()) {
    size_t hits = 0;
    for (size_t at = s.find(from); at != std::string::npos && (count < 0 || static_cast<int64_t>(hits) < count);
         at = s.find(from, at + from.size())) {
      ++hits;
    }
    LAMINA_RETURN_IF_ERROR(CheckStringSize(s.size() + hits * (to.size() - from.size())));
  }
  return Value(Replace(s, from, to, count));
}

namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

absl::StatusOr<Value> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value(0);
    case Value::Kind::kString: {
      int64_t n = 0;  // code points: every byte but UTF-8's continuation bytes
      for (unsigned char c : v.str()) n += (c & 0xC0) != 0x80;
      return Value(n);
    }
    case Value::Kind::kList:
      return Value(static_cast<int64_t>(v.list().size()));
    case Value::Kind::kDict:
      return Value(static_cast<int64_t>(v.dict().size()));
    default:
      return Bad(absl::StrCat("a ", v.TypeName(), " has no length"));
  }
}

ValueList Items(const Value& dict) {
  ValueList out;
  for (const auto& [k, v] : dict.dict()) out.push_back(Value::Tuple({Value(k), v}));
  return out;
}

// An item's attribute by a dotted path ("a.b"), for map, sort, selectattr, join, sum.
absl::StatusOr<Value> Attribute(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    LAMINA_ASSIGN_OR_RETURN(v, GetItem(v, Value(path.substr(start, dot - start))));
    start = dot + 1;
  }
  return v;
}

absl::StatusOr<ValueList> Sorted(ValueList items, const Value* attribute, bool reverse) {
  absl::Status status;
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) {
    Value key = item;
    if (attribute != nullptr && attribute->is_string()) {
      LAMINA_ASSIGN_OR_RETURN(key, Attribute(item, attribute->str()));
    }
    if (key.is_string()) key = Value(Lower(key.str()));  // Jinja sorts case-insensitively
    keyed.emplace_back(std::move(key), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    absl::StatusOr<int> c = Compare(a.first, b.first);
    if (!c.ok()) {
      status = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  LAMINA_RETURN_IF_ERROR(status);
  ValueList out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return out;
}

// select, reject, selectattr, rejectattr: keep the items whose test (truth by default) says `keep`.
absl::StatusOr<Value> FilterItems(const Value& subject, const CallArgs& args, bool by_attribute, bool keep) {
  LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(subject));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    LAMINA_ASSIGN_OR_RETURN(attribute, StringArg(args, next++, "attribute", "selectattr"));
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return Bad("select's test must be named by a string");
    test = args.positional[next++].str();
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end());
  ValueList out;
  for (const Value& item : items) {
    Value subject_value = item;
    if (by_attribute) {
      LAMINA_ASSIGN_OR_RETURN(subject_value, Attribute(item, attribute));
    }
    bool passed = subject_value.Truthy();
    if (!test.empty()) {
      LAMINA_ASSIGN_OR_RETURN(passed, ApplyTest(test, subject_value, test_args));
    }
    if (passed == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Map(const Value& subject, const CallArgs& args) {
  LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(subject));
  ValueList out;
  const Value* attribute = Named(args, "attribute");  // map(attribute=...) takes it by keyword only
  if (attribute != nullptr) {
    if (!attribute->is_string()) return Bad("map's attribute must be a string");
    const Value* fallback = Named(args, "default");
    for (const Value& item : items) {
      LAMINA_ASSIGN_OR_RETURN(Value v, Attribute(item, attribute->str()));
      out.push_back(v.is_undefined() && fallback != nullptr ? *fallback : v);
    }
    return Value::List(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return Bad("map needs a filter's name or attribute=");
  }
  CallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.named = args.named;
  for (const Value& item : items) {
    LAMINA_ASSIGN_OR_RETURN(Value v, ApplyFilter(args.positional[0].str(), item, filter_args));
    out.push_back(std::move(v));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Indent(const std::string& s, const CallArgs& args) {
  const Value* width = Arg(args, 0, "width");
  const Value* first = Arg(args, 1, "first");
  const Value* blank = Arg(args, 2, "blank");
  std::string pad = "    ";
  if (width != nullptr && width->is_string()) pad = width->str();
  if (width != nullptr && width->is_integer()) {
    if (width->int_value() < 0 || width->int_value() > 1000) return Bad("indent's width must be from 0 to 1000");
    pad = std::string(static_cast<size_t>(width->int_value()), ' ');
  }
  std::string out;
  size_t pos = 0;
  bool first_line = true;
  while (pos <= s.size()) {
    const size_t nl = s.find('\n', pos);
    const std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    const bool indent = first_line ? first != nullptr && first->Truthy()
                                   : (blank != nullptr && blank->Truthy()) || !Strip(line, nullptr, true, true).empty();
    absl::StrAppend(&out, indent ? pad : "", line);
    LAMINA_RETURN_IF_ERROR(CheckStringSize(out.size()));
    if (nl == std::string::npos) break;
    out += '\n';
    pos = nl + 1;
    first_line = false;
  }
  return Value(out);
}

absl::StatusOr<Value> Round(const Value& v, const CallArgs& args) {
  if (!v.is_number()) return Bad("round needs a number");
  const Value* precision = Arg(args, 0, "precision");
  const Value* method = Arg(args, 1, "method");
  const double scale = std::pow(10.0, precision != nullptr && precision->is_integer() ? precision->int_value() : 0);
  const std::string how = method != nullptr && method->is_string() ? method->str() : "common";
  double x = v.number() * scale;
  if (how == "common") {
    x = std::nearbyint(x);  // Python's round(): halves to even
  } else if (how == "ceil") {
    x = std::ceil(x);
  } else if (how == "floor") {
    x = std::floor(x);
  } else {
    return Bad("round's method must be common, ceil or floor");
  }
  return Value(x / scale);
}

absl::StatusOr<Value> ToInt(const Value& v, const CallArgs& args) {
  const Value* fallback = Arg(args, 0, "default");
  if (v.is_integer()) return Value(v.int_value());
  if (v.kind() == Value::Kind::kFloat) return Value(static_cast<int64_t>(v.number()));
  if (v.is_string()) {
    const std::string s = Strip(v.str(), nullptr, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value(static_cast<int64_t>(d));
  }
  return fallback != nullptr ? *fallback : Value(0);
}

absl::StatusOr<Value> MinMax(const Value& subject, bool max) {
  LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(subject));
  if (items.empty()) return Value::Undefined("min or max of an empty sequence");
  Value best = items[0];
  for (const Value& item : items) {
    LAMINA_ASSIGN_OR_RETURN(int c, Compare(item, best));
    if (max ? c > 0 : c < 0) best = item;
  }
  return best;
}

}  // namespace

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integer() && b.is_integer()) return a.int_value() < b.int_value() ? -1 : a.int_value() > b.int_value();
    return a.number() < b.number() ? -1 : a.number() > b.number();
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() != b.str();
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < std::min(a.list().size(), b.list().size()); ++i) {
      LAMINA_ASSIGN_OR_RETURN(int c, Compare(a.list()[i], b.list()[i]));
      if (c != 0) return c;
    }
    return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size();
  }
  return Bad(absl::StrCat("cannot order a ", a.TypeName(), " and a ", b.TypeName()));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) return Bad(absl::StrCat("'in <string>' needs a string, not a ", item.TypeName()));
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.list().begin(), container.list().end(),
                         [&](const Value& v) { return v.Equals(item); });
    case Value::Kind::kDict:
      return item.is_string() && container.Find(item.str()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      return Bad(absl::StrCat("'in' needs a string, list or dict, not a ", container.TypeName()));
  }
}

absl::StatusOr<Value> GetItem(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      return Bad(object.name().empty() ? "a value is undefined" : object.name());
    case Value::Kind::kDict: {
      const Value* v = key.is_string() ? object.Find(key.str()) : nullptr;
      if (v != nullptr) return *v;
      return Value::Undefined(absl::StrCat("'", object.TypeName(), " object' has no attribute ", key.Repr()));
    }
    case Value::Kind::kList:
    case Value::Kind::kString: {
      if (!key.is_integer()) {
        return Value::Undefined(absl::StrCat("'", object.TypeName(), " object' has no attribute ", key.Repr()));
      }
      std::vector<std::string> chars;
      if (object.is_string()) {
        LAMINA_RETURN_IF_ERROR(CheckListSize(object.str().size()));
        chars = SplitCodePoints(object.str());
      }
      const int64_t size =
          object.is_list() ? static_cast<int64_t>(object.list().size()) : static_cast<int64_t>(chars.size());
      int64_t i = key.int_value();
      if (i < 0) i += size;
      if (i < 0 || i >= size) {
        return Value::Undefined(
            absl::StrCat("index ", key.int_value(), " is out of range of a ", object.TypeName(), " of ", size));
      }
      return object.is_list() ? object.list()[static_cast<size_t>(i)] : Value(chars[static_cast<size_t>(i)]);
    }
    default:
      return Value::Undefined(absl::StrCat("'", object.TypeName(), " object' has no attribute ", key.Repr()));
  }
}

absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& [k, unused] : v.dict()) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      LAMINA_RETURN_IF_ERROR(CheckListSize(v.str().size()));
      ValueList chars;
      for (std::string& c : SplitCodePoints(v.str())) chars.emplace_back(std::move(c));
      return chars;
    }
    default:
      return Bad(absl::StrCat("a ", v.TypeName(), " cannot be iterated"));
  }
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const CallArgs& args) {
  const auto need_string = [&]() -> absl::Status {
    if (v.is_string()) return absl::OkStatus();
    return Bad(absl::StrCat("the filter '", name, "' needs a string, not a ", v.TypeName()));
  };
  if (name == "safe") return v;
  if (name == "string") return Value(v.ToString());
  if (name == "length" || name == "count") return Length(v);
  if (name == "default" || name == "d") {
    const Value* fallback = Arg(args, 0, "default_value");
    const Value* boolean = Arg(args, 1, "boolean");
    const bool use_fallback = boolean != nullptr && boolean->Truthy() ? !v.Truthy() : v.is_undefined();
    return use_fallback ? (fallback != nullptr ? *fallback : Value("")) : v;
  }
  if (name == "tojson") {
    const Value* indent = Arg(args, 0, "indent");
    LAMINA_ASSIGN_OR_RETURN(
        std::string json,
        v.ToJson(indent != nullptr && indent->is_integer() ? static_cast<int>(indent->int_value()) : -1));
    return Value(std::move(json));
  }
  if (name == "trim") {
    LAMINA_RETURN_IF_ERROR(need_string());
    return Value(Strip(v.str(), Arg(args, 0, "chars"), true, true));
  }
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title" || name == "escape" ||
      name == "e") {
    const std::string s = v.ToString();
    if (name == "lower") return Value(Lower(s));
    if (name == "upper") return Value(Upper(s));
    if (name == "capitalize") return Value(Capitalize(s));
    if (name == "title") return Value(Title(s));
    return Value(Escape(s));
  }
  if (name == "replace") {
    LAMINA_RETURN_IF_ERROR(need_string());
    LAMINA_ASSIGN_OR_RETURN(std::string from, StringArg(args, 0, "old", "replace"));
    LAMINA_ASSIGN_OR_RETURN(std::string to, StringArg(args, 1, "new", "replace"));
    const Value* count = Arg(args, 2, "count");
    return CheckedReplace(v.str(), from, to, count != nullptr && count->is_integer() ? count->int_value() : -1);
  }
  if (name == "indent") {
    LAMINA_RETURN_IF_ERROR(need_string());
    return Indent(v.str(), args);
  }
  if (name == "join") {
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    const Value* separator = Arg(args, 0, "d");
    const Value* attribute = Arg(args, 1, "attribute");
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value item = items[i];
      if (attribute != nullptr && attribute->is_string()) {
        LAMINA_ASSIGN_OR_RETURN(item, Attribute(item, attribute->str()));
      }
      absl::StrAppend(&out, i > 0 && separator != nullptr ? separator->ToString() : "", item.ToString());
      LAMINA_RETURN_IF_ERROR(CheckStringSize(out.size()));
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    if (items.empty()) return Value::Undefined(absl::StrCat("the ", name, " item of an empty sequence"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string> chars = SplitCodePoints(v.str());
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "items" || name == "dictsort") {
    if (!v.is_dict()) return Bad(absl::StrCat("the filter '", name, "' needs a dict, not a ", v.TypeName()));
    if (name == "items") return Value::List(Items(v));
    ValueList items = Items(v);
    std::stable_sort(items.begin(), items.end(), [](const Value& a, const Value& b) {
      return Lower(a.list()[0].str()) < Lower(b.list()[0].str());
    });
    return Value::List(std::move(items));
  }
  if (name == "sort") {
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    const Value* reverse = Arg(args, 0, "reverse");
    LAMINA_ASSIGN_OR_RETURN(items, Sorted(std::move(items), Arg(args, 2, "attribute"), reverse && reverse->Truthy()));
    return Value::List(std::move(items));
  }
  if (name == "unique") {
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    ValueList out;
    for (const Value& item : items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.Equals(item); })) out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  if (name == "map") return Map(v, args);
  if (name == "select" || name == "reject") return FilterItems(v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return FilterItems(v, args, true, name == "selectattr");
  if (name == "attr") {
    LAMINA_ASSIGN_OR_RETURN(std::string attribute, StringArg(args, 0, "name", "attr"));
    return GetItem(v, Value(attribute));
  }
  if (name == "abs") {
    if (!v.is_number()) return Bad("abs needs a number");
    return v.is_integer() ? Value(std::abs(v.int_value())) : Value(std::fabs(v.number()));
  }
  if (name == "int") return ToInt(v, args);
  if (name == "float") {
    if (v.is_number()) return Value(v.number());
    char* end = nullptr;
    const std::string s = Strip(v.ToString(), nullptr, true, true);
    const double d = std::strtod(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size() ? Value(d) : Value(0.0);
  }
  if (name == "round") return Round(v, args);
  if (name == "min" || name == "max") return MinMax(v, name == "max");
  if (name == "sum") {
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    const Value* attribute = Arg(args, 0, "attribute");
    const Value* start = Arg(args, 1, "start");
    Value total = start != nullptr ? *start : Value(0);
    for (Value item : items) {
      if (attribute != nullptr && attribute->is_string()) {
        LAMINA_ASSIGN_OR_RETURN(item, Attribute(item, attribute->str()));
      }
      if (!item.is_number() || !total.is_number()) return Bad("sum needs numbers");
      total = item.is_integer() && total.is_integer() ? Value(total.int_value() + item.int_value())
                                                      : Value(total.number() + item.number());
    }
    return total;
  }
  return absl::NotFoundError(absl::StrCat("no filter named '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const CallArgs& args) {
  const Value* other = Arg(args, 0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.bool_value();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.bool_value();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "number") return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kFloat;
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "sequence") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "lower") return v.is_string() && Lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && Upper(v.str()) == v.str();
  if (name == "even" || name == "odd") {
    if (!v.is_integer()) return Bad(absl::StrCat("the test '", name, "' needs an integer, not a ", v.TypeName()));
    return (v.int_value() % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    if (!v.is_integer() || other == nullptr || !other->is_integer() || other->int_value() == 0) {
      return Bad("divisibleby needs an integer and a nonzero integer");
    }
    return v.int_value() % other->int_value() == 0;
  }
  if (other == nullptr && name != "sameas") {
    for (const char* compare :
         {"eq", "equalto", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "in"}) {
      if (name == compare) return Bad(absl::StrCat("the test '", name, "' needs a value to compare with"));
    }
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") {
    return other != nullptr && v.Equals(*other);
  }
  if (name == "ne" || name == "!=") return !v.Equals(*other);
  if (name == "in") return Contains(*other, v);
  for (auto [op, want] : {std::pair{"lt", -1}, {"<", -1}, {"gt", 1}, {">", 1}}) {
    if (name == op) {
      LAMINA_ASSIGN_OR_RETURN(int c, Compare(v, *other));
      return c == want;
    }
  }
  for (auto [op, reject] : {std::pair{"le", 1}, {"<=", 1}, {"ge", -1}, {">=", -1}}) {
    if (name == op) {
      LAMINA_ASSIGN_OR_RETURN(int c, Compare(v, *other));
      return c != reject;
    }
  }
  return absl::NotFoundError(absl::StrCat("no test named '", name, "'"));
}

}  // namespace lamina::jinja
