#include "common/chat_template/renderer.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/methods.h"
#include "common/status/status_macros.h"

namespace lamina::jinja {
namespace {

constexpr int kMaxMacroDepth = 64;
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
// Nodes rendered, expressions evaluated and loop passes: chat templates take thousands; nested loops over
// long ranges would otherwise run for hours.
constexpr int64_t kMaxSteps = 5'000'000;

// The line of the innermost node that failed, once: a macro's line wins over its caller's.
absl::Status AtLine(int line, const absl::Status& status) {
  if (status.ok() || absl::StartsWith(status.message(), "line ")) return status;
  return absl::Status(status.code(), absl::StrCat("line ", line, ": ", status.message()));
}

absl::Status Bad(std::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

absl::Status CannotApply(const std::string& op, const Value& a, const Value& b) {
  return Bad(absl::StrCat("cannot apply '", op, "' to a ", a.TypeName(), " and a ", b.TypeName()));
}

// Python's a // b and a % b on integers: the quotient rounds down, the remainder takes b's sign.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string text = a.ToString() + b.ToString();
    LAMINA_RETURN_IF_ERROR(CheckStringSize(text.size()));
    return Value(std::move(text));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      LAMINA_RETURN_IF_ERROR(CheckStringSize(a.str().size() + b.str().size()));
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list()) {
      LAMINA_RETURN_IF_ERROR(CheckListSize(a.list().size() + b.list().size()));
      ValueList items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items));
    }
  }
  if (op == "*" && (a.is_string() || a.is_list()) && b.is_integer()) {
    const int64_t times = std::max<int64_t>(b.int_value(), 0);
    const size_t size = a.is_string() ? a.str().size() : a.list().size();
    if (size > 0 && static_cast<uint64_t>(times) > (a.is_string() ? kMaxStringBytes : kMaxListItems) / size) {
      return a.is_string() ? CheckStringSize(kMaxStringBytes + 1) : CheckListSize(kMaxListItems + 1);
    }
    if (a.is_string()) {
      std::string out;
      for (int64_t i = 0; i < b.int_value(); ++i) out += a.str();
      return Value(std::move(out));
    }
    ValueList items;
    for (int64_t i = 0; i < b.int_value(); ++i) items.insert(items.end(), a.list().begin(), a.list().end());
    return Value::List(std::move(items));
  }
  if (!a.is_number() || !b.is_number()) return CannotApply(op, a, b);
  const bool integers = a.is_integer() && b.is_integer();
  if ((op == "/" || op == "//" || op == "%") && b.number() == 0) return Bad("division by zero");
  if (op == "/") return Value(a.number() / b.number());
  if (integers) {
    // Python's integers never overflow; ours are 64 bits, which no chat template outgrows.
    const int64_t x = a.int_value(), y = b.int_value();
    int64_t r = 0;
    const absl::Status overflow = Bad(absl::StrCat("integer overflow in ", x, " ", op, " ", y));
    if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow : absl::StatusOr<Value>(Value(r));
    if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow : absl::StatusOr<Value>(Value(r));
    if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow : absl::StatusOr<Value>(Value(r));
    if (y == -1 && (op == "//" || op == "%")) {  // INT64_MIN // -1 overflows
      if (op == "%") return Value(int64_t{0});
      return __builtin_sub_overflow(int64_t{0}, x, &r) ? overflow : absl::StatusOr<Value>(Value(r));
    }
    if (op == "//") return Value(FloorDiv(x, y));
    if (op == "%") return Value(x - FloorDiv(x, y) * y);
    if (op == "**" && y >= 0) {
      if (x == 0 || x == 1) return Value(y == 0 ? int64_t{1} : x);
      if (x == -1) return Value(int64_t{y % 2 == 0 ? 1 : -1});
      r = 1;  // |x| >= 2 overflows within 63 products
      for (int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(r, x, &r)) return overflow;
      }
      return Value(r);
    }
  }
  const double x = a.number(), y = b.number();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "//") return Value(std::floor(x / y));
  if (op == "%") return Value(x - std::floor(x / y) * y);
  if (op == "**") return Value(std::pow(x, y));
  return CannotApply(op, a, b);
}

// Python's s[start:stop:step] for a sequence of `n`: the indices taken.
absl::StatusOr<std::vector<int64_t>> SliceIndices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_undefined() && !v->is_none() && !v->is_integer()) return Bad("a slice's bounds must be integers");
  }
  const int64_t s = step.is_integer() ? step.int_value() : 1;
  if (s == 0) return Bad("a slice's step must not be zero");
  const auto bound = [&](const Value& v, int64_t fallback) {
    if (!v.is_integer()) return fallback;
    int64_t i = v.int_value();
    if (i < 0) i += n;
    if (s > 0) return std::min(std::max<int64_t>(i, 0), n);
    return std::min(std::max<int64_t>(i, -1), n - 1);
  };
  const int64_t from = bound(start, s > 0 ? 0 : n - 1);
  const int64_t to = bound(stop, s > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = from; s > 0 ? i < to : i > to; i += s) out.push_back(i);
  return out;
}

// A filter or test the template names and nobody defines is the template's error.
template <typename T>
absl::StatusOr<T> Unknown(absl::StatusOr<T> result) {
  if (absl::IsNotFound(result.status())) return Bad(std::string(result.status().message()));
  return result;
}

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const ValueDict& variables) {
    scopes_.emplace_back();
    for (auto& [name, value] : GlobalFunctions()) scopes_[0][name] = std::move(value);
    for (const auto& [name, value] : variables) scopes_[0][name] = value;
  }

  absl::Status RenderBody(const Body& body, std::string* out, Flow* flow) {
    for (const auto& node : body) {
      LAMINA_RETURN_IF_ERROR(AtLine(node->line, RenderNode(*node, out, flow)));
      if (*flow != Flow::kNormal) return absl::OkStatus();
      if (out->size() > kMaxOutputBytes) return Bad(absl::StrCat("the output is over ", kMaxOutputBytes >> 20, " MiB"));
    }
    return absl::OkStatus();
  }

 private:
  using Scope = std::unordered_map<std::string, Value>;

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  absl::Status CountStep() {
    if (++steps_ > kMaxSteps) return Bad(absl::StrCat("the template ran over ", kMaxSteps, " steps"));
    return absl::OkStatus();
  }

  absl::Status RenderNode(const Node& node, std::string* out, Flow* flow) {
    LAMINA_RETURN_IF_ERROR(CountStep());
    switch (node.kind) {
      case Node::Kind::kText:
        *out += node.text;
        return absl::OkStatus();
      case Node::Kind::kOutput: {
        LAMINA_ASSIGN_OR_RETURN(Value v, Eval(*node.expr));
        const std::string text = v.ToString();
        LAMINA_RETURN_IF_ERROR(CheckStringSize(text.size()));
        *out += text;
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches) {
          bool take = condition == nullptr;
          if (!take) {
            LAMINA_ASSIGN_OR_RETURN(Value v, Eval(*condition));
            take = v.Truthy();
          }
          if (take) return RenderBody(body, out, flow);
        }
        return absl::OkStatus();
      case Node::Kind::kFor:
        return RenderFor(node, out);
      case Node::Kind::kSet:
        return RenderSet(node);
      case Node::Kind::kMacro:
        scopes_.back()[node.name] = MakeMacro(node);
        return absl::OkStatus();
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loop_depth_ == 0) return Bad("break or continue outside a for loop");
        *flow = node.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
        return absl::OkStatus();
      case Node::Kind::kBlock:
        return RenderBody(node.body, out, flow);
    }
    return absl::OkStatus();
  }

  absl::Status Bind(const std::vector<std::string>& targets, const Value& value, Scope* scope) {
    if (targets.size() == 1) {
      (*scope)[targets[0]] = value;
      return absl::OkStatus();
    }
    if (!value.is_list() || value.list().size() != targets.size()) {
      return Bad(absl::StrCat("cannot unpack a ", value.TypeName(), " into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) (*scope)[targets[i]] = value.list()[i];
    return absl::OkStatus();
  }

  absl::Status RenderFor(const Node& node, std::string* out) {
    LAMINA_ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr));
    LAMINA_ASSIGN_OR_RETURN(ValueList items, Iterate(iterable));
    if (node.filter != nullptr) {
      ValueList kept;
      for (Value& item : items) {
        LAMINA_RETURN_IF_ERROR(CountStep());
        scopes_.emplace_back();
        absl::Status bound = Bind(node.targets, item, &scopes_.back());
        absl::StatusOr<Value> keep = bound.ok() ? Eval(*node.filter) : bound;
        scopes_.pop_back();
        LAMINA_RETURN_IF_ERROR(keep.status());
        if (keep->Truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    Flow flow = Flow::kNormal;
    if (items.empty()) return RenderBody(node.else_body, out, &flow);
    const int64_t n = static_cast<int64_t>(items.size());
    ++loop_depth_;
    absl::Status status;
    for (int64_t i = 0; i < n && status.ok(); ++i) {
      status = CountStep();  // a pass of an empty body is a step too
      if (!status.ok()) break;
      scopes_.emplace_back();
      ValueDict loop = {{"index", Value(i + 1)},    {"index0", Value(i)},
                        {"revindex", Value(n - i)}, {"revindex0", Value(n - i - 1)},
                        {"first", Value(i == 0)},   {"last", Value(i == n - 1)},
                        {"length", Value(n)}};
      if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      scopes_.back()["loop"] = Value::Dict(std::move(loop));
      status = Bind(node.targets, items[static_cast<size_t>(i)], &scopes_.back());
      flow = Flow::kNormal;
      if (status.ok()) status = RenderBody(node.body, out, &flow);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    --loop_depth_;
    return status;
  }

  absl::Status RenderSet(const Node& node) {
    Value value;
    if (node.expr == nullptr) {  // {% set x %}body{% endset %}
      std::string text;
      Flow flow = Flow::kNormal;
      LAMINA_RETURN_IF_ERROR(RenderBody(node.body, &text, &flow));
      value = Value(std::move(text));
    } else {
      LAMINA_ASSIGN_OR_RETURN(value, Eval(*node.expr));
    }
    if (node.attr.empty()) return Bind(node.targets, value, &scopes_.back());
    const Value target = Lookup(node.targets[0]);
    if (!target.is_namespace()) {
      return Bad(absl::StrCat("cannot set '", node.targets[0], ".", node.attr, "': '", node.targets[0], "' is a ",
                              target.TypeName(), ", and only a namespace() can change"));
    }
    target.SetField(node.attr, std::move(value));
    return absl::OkStatus();
  }

  Value MakeMacro(const Node& node) {
    return Value::Callable(node.name, [this, &node](const CallArgs& args) -> absl::StatusOr<Value> {
      if (args.positional.size() > node.params.size()) {
        return Bad(absl::StrCat("the macro '", node.name, "' takes ", node.params.size(), " arguments, not ",
                                args.positional.size()));
      }
      if (macro_depth_ >= kMaxMacroDepth) return Bad(absl::StrCat("macros nest over ", kMaxMacroDepth, " deep"));
      Scope scope;
      for (size_t i = 0; i < node.params.size(); ++i) {
        const auto& [param, fallback] = node.params[i];
        if (i < args.positional.size()) {
          scope[param] = args.positional[i];
        } else if (fallback != nullptr) {
          LAMINA_ASSIGN_OR_RETURN(scope[param], Eval(*fallback));
        } else {
          scope[param] = Value::Undefined(absl::StrCat("'", param, "' is undefined"));
        }
      }
      for (const auto& [key, value] : args.named) {
        bool known = false;
        for (const auto& param : node.params) known = known || param.first == key;
        if (!known) return Bad(absl::StrCat("the macro '", node.name, "' has no argument '", key, "'"));
        scope[key] = value;
      }
      // A macro sees the template's top-level names and its own arguments.
      std::vector<Scope> caller_scopes = {scopes_[0], std::move(scope)};
      std::swap(scopes_, caller_scopes);
      const int caller_loop_depth = loop_depth_;
      loop_depth_ = 0;
      ++macro_depth_;
      std::string text;
      Flow flow = Flow::kNormal;
      absl::Status status = RenderBody(node.body, &text, &flow);
      --macro_depth_;
      loop_depth_ = caller_loop_depth;
      std::swap(scopes_, caller_scopes);
      LAMINA_RETURN_IF_ERROR(status);
      return Value(std::move(text));
    });
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) {
      LAMINA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.named) {
      LAMINA_ASSIGN_OR_RETURN(Value v, Eval(*expr));
      args.named.emplace_back(key, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e) { return AtLineOr(e.line, EvalHere(e)); }

  static absl::StatusOr<Value> AtLineOr(int line, absl::StatusOr<Value> v) {
    if (v.ok()) return v;
    return AtLine(line, v.status());
  }

  absl::StatusOr<Value> EvalHere(const Expr& e) {
    LAMINA_RETURN_IF_ERROR(CountStep());
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        ValueList items;
        LAMINA_RETURN_IF_ERROR(CheckListSize(e.args.size()));
        for (const auto& item : e.args) {
          LAMINA_ASSIGN_OR_RETURN(Value v, Eval(*item));
          items.push_back(std::move(v));
        }
        return e.name == "tuple" ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          LAMINA_ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
          if (!key.is_string()) return Bad(absl::StrCat("a dict's keys must be strings, not a ", key.TypeName()));
          LAMINA_ASSIGN_OR_RETURN(Value value, Eval(*e.args[i + 1]));
          items.emplace_back(key.str(), std::move(value));
        }
        return Value::Dict(std::move(items));
      }
      case Expr::Kind::kAttr: {
        LAMINA_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
        return GetItem(object, Value(e.name));
      }
      case Expr::Kind::kIndex: {
        LAMINA_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
        LAMINA_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(object, key);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e);
      case Expr::Kind::kCall:
        return EvalCall(e);
      case Expr::Kind::kFilter: {
        LAMINA_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        LAMINA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return Unknown(ApplyFilter(e.name, subject, args));
      }
      case Expr::Kind::kTest: {
        LAMINA_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        LAMINA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        LAMINA_ASSIGN_OR_RETURN(bool passed, Unknown(ApplyTest(e.name, subject, args)));
        return Value(passed != e.negated);
      }
      case Expr::Kind::kUnary: {
        LAMINA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (e.name == "not") return Value(!v.Truthy());
        if (!v.is_number()) return Bad(absl::StrCat("cannot apply unary '", e.name, "' to a ", v.TypeName()));
        if (e.name == "+") return v;
        return v.is_integer() ? Value(-v.int_value()) : Value(-v.number());
      }
      case Expr::Kind::kBinary:
        return EvalBinary(e);
      case Expr::Kind::kIf: {
        LAMINA_ASSIGN_OR_RETURN(Value condition, Eval(*e.args[1]));
        if (condition.Truthy()) return Eval(*e.args[0]);
        if (e.args[2] == nullptr) return Value::Undefined("an if expression without else");
        return Eval(*e.args[2]);
      }
    }
    return Bad("unknown expression");
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    LAMINA_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
    if (e.name == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
    if (e.name == "or") return a.Truthy() ? a : Eval(*e.args[1]);
    LAMINA_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
    if (e.name == "==") return Value(a.Equals(b));
    if (e.name == "!=") return Value(!a.Equals(b));
    if (e.name == "in" || e.name == "not in") {
      LAMINA_ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return Value(in == (e.name == "in"));
    }
    if (e.name == "<" || e.name == "<=" || e.name == ">" || e.name == ">=") {
      LAMINA_ASSIGN_OR_RETURN(int c, Compare(a, b));
      if (e.name == "<") return Value(c < 0);
      if (e.name == "<=") return Value(c <= 0);
      if (e.name == ">") return Value(c > 0);
      return Value(c >= 0);
    }
    return Arithmetic(e.name, a, b);
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    LAMINA_ASSIGN_OR_RETURN(Value object, Eval(*e.args[0]));
    Value bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (e.args[i + 1] != nullptr) {
        LAMINA_ASSIGN_OR_RETURN(bounds[i], Eval(*e.args[i + 1]));
      }
    }
    if (object.is_list()) {
      LAMINA_ASSIGN_OR_RETURN(std::vector<int64_t> indices, SliceIndices(static_cast<int64_t>(object.list().size()),
                                                                         bounds[0], bounds[1], bounds[2]));
      ValueList items;
      for (int64_t i : indices) items.push_back(object.list()[static_cast<size_t>(i)]);
      return Value::List(std::move(items));
    }
    if (object.is_string()) {
      const std::vector<std::string> chars = SplitCodePoints(object.str());
      LAMINA_ASSIGN_OR_RETURN(std::vector<int64_t> indices,
                              SliceIndices(static_cast<int64_t>(chars.size()), bounds[0], bounds[1], bounds[2]));
      std::string text;
      for (int64_t i : indices) text += chars[static_cast<size_t>(i)];
      return Value(std::move(text));
    }
    if (object.is_undefined()) return Bad(object.name().empty() ? "a value is undefined" : object.name());
    return Bad(absl::StrCat("a ", object.TypeName(), " cannot be sliced"));
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    LAMINA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kAttr) {
      LAMINA_ASSIGN_OR_RETURN(Value object, Eval(*callee.args[0]));
      if (object.is_undefined()) return Bad(object.name().empty() ? "a value is undefined" : object.name());
      absl::StatusOr<Value> result = CallMethod(object, callee.name, args);
      if (!absl::IsNotFound(result.status())) return result;
      const Value* field = object.Find(callee.name);
      if (field == nullptr || !field->is_callable()) return Bad(std::string(result.status().message()));
      return field->function()(args);
    }
    LAMINA_ASSIGN_OR_RETURN(Value function, Eval(callee));
    if (function.is_undefined()) return Bad(function.name());
    if (!function.is_callable()) return Bad(absl::StrCat("a ", function.TypeName(), " cannot be called"));
    return function.function()(args);
  }

  std::vector<Scope> scopes_;
  int loop_depth_ = 0;
  int macro_depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Render(const Body& body, const ValueDict& variables) {
  Renderer renderer(variables);
  std::string out;
  Flow flow = Flow::kNormal;
  LAMINA_RETURN_IF_ERROR(renderer.RenderBody(body, &out, &flow));
  return out;
}

}  // namespace lamina::jinja
