// The values a chat template computes with: Jinja's, which are Python's (None, bool, int, float,
// str, list, dict), plus Jinja's undefined and callables (macros, built-in functions, namespaces).
//
// Strings hold UTF-8; where Python counts characters (len, indexing, slicing) these count code
// points. Lists and dicts are immutable once built, as in the sandbox Hugging Face renders chat
// templates in; only a namespace() changes, through `{% set ns.field = ... %}`. Copies share their
// list, dict or namespace. Thread-compatible.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_VALUE_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::jinja {

// The most bytes one string value may hold, and the most items one list may: a template that
// builds more (`'x' * 10**9`, a string doubled in a loop) fails instead of exhausting memory.
constexpr size_t kMaxStringBytes = size_t{16} << 20;
constexpr size_t kMaxListItems = size_t{1} << 20;

class Value;
using ValueList = std::vector<Value>;
// Insertion-ordered, as a Python dict is: tojson and items() keep the order the keys came in.
using ValueDict = std::vector<std::pair<std::string, Value>>;

// The arguments of a call: positional, then by keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};
using Function = std::function<absl::StatusOr<Value>(const CallArgs& args)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  // Undefined; `name` says what was looked up, for error messages ("'tools' is undefined").
  Value() = default;
  static Value Undefined(std::string name);
  static Value None();
  Value(bool b);                                    // NOLINT: implicit, like a literal
  Value(int64_t i);                                 // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d);                                  // NOLINT
  Value(std::string s);                             // NOLINT
  Value(const char* s);                             // NOLINT
  static Value List(ValueList items);
  // A list that prints as a Python tuple: "(1, 2)". Otherwise a list in every way.
  static Value Tuple(ValueList items);
  static Value Dict(ValueDict items);
  // A dict whose fields `{% set ns.name = ... %}` may change: Jinja's namespace().
  static Value Namespace(ValueDict items);
  static Value Callable(std::string name, Function fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && mutable_; }
  bool is_callable() const { return kind_ == Kind::kFunction; }
  // bool, int and float: what arithmetic takes (True + 1 == 2, as in Python).
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_integer() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }

  // Valid only for the matching kind.
  bool bool_value() const { return b_; }
  int64_t int_value() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double number() const { return kind_ == Kind::kFloat ? d_ : static_cast<double>(int_value()); }
  const std::string& str() const { return *s_; }
  const ValueList& list() const { return *list_; }
  const ValueDict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }
  // The undefined value's name, or a callable's.
  const std::string& name() const { return *s_; }

  // A dict's value for `key`, or null.
  const Value* Find(std::string_view key) const;
  // Sets a namespace's field. Only for is_namespace().
  void SetField(const std::string& key, Value value) const;

  // Python's truth: empty strings, lists and dicts, 0, None and undefined are false.
  bool Truthy() const;
  // Python's str(): a string as it is, None as "None", True as "True", lists and dicts as repr;
  // undefined as "" (Jinja prints nothing for it). A repr stops a little past kMaxStringBytes.
  std::string ToString() const;
  // Python's repr(): strings quoted.
  std::string Repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent) as Hugging Face's tojson filter calls it
  // (keys in their order, not sorted); indent < 0 for one line. Undefined and callables fail.
  absl::StatusOr<std::string> ToJson(int indent) const;
  // Python's ==: numbers by value (1 == 1.0), containers element by element.
  bool Equals(const Value& other) const;
  // "string", "list", "undefined", ...: for error messages.
  std::string TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  // A string; the name of an undefined value or a callable. Shared: copies of values are cheap.
  std::shared_ptr<const std::string> s_ = EmptyString();
  static const std::shared_ptr<const std::string>& EmptyString();
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Function> fn_;
  bool mutable_ = false;  // a namespace
  bool tuple_ = false;    // a list that prints as a tuple
};

// InvalidArgument when a string of `bytes`, or a list of `items`, would pass the limits above.
absl::Status CheckStringSize(size_t bytes);
absl::Status CheckListSize(size_t items);

// Python's repr() of a float: the shortest digits that read back the same, "1.0" for whole
// numbers, an exponent outside 1e-4 <= |x| < 1e16.
std::string FloatRepr(double d);

// The code points of UTF-8 text, each as its own string (an invalid byte stands alone).
std::vector<std::string> SplitCodePoints(std::string_view text);

}  // namespace lamina::jinja

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_VALUE_H_
