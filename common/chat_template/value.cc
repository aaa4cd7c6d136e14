#include "common/chat_template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/utf8.h"

namespace lamina::jinja {

const std::shared_ptr<const std::string>& Value::EmptyString() {
  static const auto* empty = new std::shared_ptr<const std::string>(std::make_shared<const std::string>());
  return *empty;
}

Value Value::Undefined(std::string name) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(const char* s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(s)) {}

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.mutable_ = true;
  return v;
}

Value Value::Callable(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const Function>(std::move(fn));
  return v;
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::SetField(const std::string& key, Value value) const {
  for (auto& [k, v] : *dict_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  dict_->emplace_back(key, std::move(value));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

absl::Status CheckStringSize(size_t bytes) {
  if (bytes <= kMaxStringBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a string would pass ", kMaxStringBytes >> 20, " MiB"));
}

absl::Status CheckListSize(size_t items) {
  if (items <= kMaxListItems) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a list would pass ", kMaxListItems, " items"));
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest round-tripping digits, then laid out as Python lays them out.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, end);  // e.g. "-1.2345e+03"
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exponent = std::atoi(sci.c_str() + e + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) return absl::StrCat(out, "0.", std::string(-exponent - 1, '0'), digits);
  const size_t whole = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= whole) return absl::StrCat(out, digits, std::string(whole - digits.size(), '0'), ".0");
  return absl::StrCat(out, digits.substr(0, whole), ".", digits.substr(whole));
}

std::vector<std::string> SplitCodePoints(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view c : utf8::SplitChars(text)) out.emplace_back(c);
  return out;
}

namespace {

std::string StringRepr(const std::string& s) {
  // Python picks single quotes unless the text has one and no double quote.
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == quote) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\u%04x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

absl::Status AppendJson(const Value& v, int indent, int depth, std::string* out) {
  if (out->size() > kMaxStringBytes || depth > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("tojson's text would pass ", kMaxStringBytes >> 20, " MiB"));
  }
  // json.dumps: ", " and ": " on one line; "," and ": " with an indent, each item on its own line.
  const auto newline = [&](int level) {
    if (indent >= 0) absl::StrAppend(out, "\n", std::string(static_cast<size_t>(indent * level), ' '));
  };
  const char* item_separator = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson cannot write an undefined value", v.name().empty() ? "" : " ('" + v.name() + "')"));
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError(absl::StrCat("tojson cannot write the function '", v.name(), "'"));
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat:
      if (std::isnan(v.number())) {
        *out += "NaN";
      } else if (std::isinf(v.number())) {
        *out += v.number() > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FloatRepr(v.number());
      }
      return absl::OkStatus();
    case Value::Kind::kString:
      *out += JsonString(v.str());
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += item_separator;
        newline(depth + 1);
        LAMINA_RETURN_IF_ERROR(AppendJson(v.list()[i], indent, depth + 1, out));
      }
      newline(depth);
      *out += "]";
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      *out += "{";
      for (size_t i = 0; i < v.dict().size(); ++i) {
        if (i > 0) *out += item_separator;
        newline(depth + 1);
        absl::StrAppend(out, JsonString(v.dict()[i].first), ": ");
        LAMINA_RETURN_IF_ERROR(AppendJson(v.dict()[i].second, indent, depth + 1, out));
      }
      newline(depth);
      *out += "}";
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return FloatRepr(d_);
    case Kind::kString:
      return StringRepr(*s_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size() && out.size() <= kMaxStringBytes; ++i) {
        absl::StrAppend(&out, i > 0 ? ", " : "", (*list_)[i].Repr());
      }
      if (tuple_) return out + (list_->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = mutable_ ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->size() && out.size() <= kMaxStringBytes; ++i) {
        absl::StrAppend(&out, i > 0 ? ", " : "", StringRepr((*dict_)[i].first), ": ", (*dict_)[i].second.Repr());
      }
      return out + (mutable_ ? "}>" : "}");
    }
    case Kind::kFunction:
      return absl::StrCat("<function ", *s_, ">");
  }
  return "";
}

absl::StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  LAMINA_RETURN_IF_ERROR(AppendJson(*this, indent, 0, &out));
  return out;
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_integer() && other.is_integer()) return int_value() == other.int_value();
    return number() == other.number();
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *s_ == *other.s_;
    case Kind::kList:
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_->size() != other.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* o = other.Find(k);
        if (o == nullptr || !v.Equals(*o)) return false;
      }
      return true;
    case Kind::kFunction:
      return fn_ == other.fn_;
    default:
      return false;
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return mutable_ ? "namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "value";
}

}  // namespace lamina::jinja
