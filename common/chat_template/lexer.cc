#include "common/chat_template/lexer.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace lamina::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int CountLines(std::string_view text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

absl::Status ErrorAt(int line, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", std::string(what)));
}

// Reads a string literal starting at its quote; `*pos` ends past the closing quote.
absl::StatusOr<std::string> ReadString(std::string_view src, size_t* pos, int line) {
  const char quote = src[*pos];
  std::string out;
  size_t i = *pos + 1;
  while (i < src.size() && src[i] != quote) {
    if (src[i] != '\\' || i + 1 >= src.size()) {
      out += src[i++];
      continue;
    }
    const char e = src[i + 1];
    i += 2;
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '0':
        out += '\0';
        break;
      case '\\':
      case '\'':
      case '"':
        out += e;
        break;
      case '\n':  // a backslash at a line's end joins the lines
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        const std::string hex(src.substr(i, digits));
        if (hex.size() != digits || !std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(c); })) {
          return ErrorAt(line, absl::StrCat("a string has a bad \\", std::string(1, e), " escape"));
        }
        utf8::Append(static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16)), &out);
        i += digits;
        break;
      }
      default:  // Python keeps an unknown escape as written
        out += '\\';
        out += e;
    }
  }
  if (i >= src.size()) return ErrorAt(line, "a string is never closed");
  *pos = i + 1;
  return out;
}

constexpr std::string_view kTwoCharOperators[] = {"//", "**", "==", "!=", "<=", ">="};
constexpr std::string_view kOneCharOperators = "+-*/%~<>=()[]{},.:|";

struct TagEnd {
  size_t pos;     // past the close marker
  char modifier;  // '-', '+' or 0
};

// Tokenizes the inside of a `{{` or `{%` tag from `*pos` to its close marker (`close`: "}}" or
// "%}", outside brackets and strings), appending to `out`.
absl::StatusOr<TagEnd> TokenizeTag(std::string_view src, size_t pos, std::string_view close, int* line,
                                   std::vector<Token>* out) {
  const int open_line = *line;
  int depth = 0;
  while (true) {
    while (pos < src.size() && IsSpace(src[pos])) {
      if (src[pos] == '\n') ++*line;
      ++pos;
    }
    if (pos >= src.size()) {
      return ErrorAt(open_line, absl::StrCat("a tag is never closed with '", std::string(close), "'"));
    }
    if (depth == 0) {
      if (src.substr(pos, close.size()) == close) return TagEnd{pos + close.size(), 0};
      if ((src[pos] == '-' || src[pos] == '+') && src.substr(pos + 1, close.size()) == close) {
        return TagEnd{pos + 1 + close.size(), src[pos]};
      }
    }
    Token t;
    t.line = *line;
    const char c = src[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos;
      while (pos < src.size() && (std::isalnum(static_cast<unsigned char>(src[pos])) || src[pos] == '_')) ++pos;
      t.kind = Token::Kind::kName;
      t.text = std::string(src.substr(start, pos - start));
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      const size_t start = pos;
      while (pos < src.size() && std::isdigit(static_cast<unsigned char>(src[pos]))) ++pos;
      bool is_float = false;
      if (pos + 1 < src.size() && src[pos] == '.' && std::isdigit(static_cast<unsigned char>(src[pos + 1]))) {
        is_float = true;
        for (++pos; pos < src.size() && std::isdigit(static_cast<unsigned char>(src[pos]));) ++pos;
      }
      if (pos < src.size() && (src[pos] == 'e' || src[pos] == 'E')) {
        size_t e = pos + 1;
        if (e < src.size() && (src[e] == '+' || src[e] == '-')) ++e;
        if (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) {
          is_float = true;
          for (pos = e; pos < src.size() && std::isdigit(static_cast<unsigned char>(src[pos]));) ++pos;
        }
      }
      t.text = std::string(src.substr(start, pos - start));
      if (is_float) {
        t.kind = Token::Kind::kFloat;
        t.float_value = std::strtod(t.text.c_str(), nullptr);
      } else {
        t.kind = Token::Kind::kInt;
        t.int_value = std::strtoll(t.text.c_str(), nullptr, 10);
      }
    } else if (c == '\'' || c == '"') {
      auto text = ReadString(src, &pos, *line);
      if (!text.ok()) return text.status();
      t.kind = Token::Kind::kString;
      t.text = *std::move(text);
      *line += CountLines(t.text);
    } else {
      t.kind = Token::Kind::kOperator;
      for (std::string_view op : kTwoCharOperators) {
        if (src.substr(pos, 2) == op) t.text = std::string(op);
      }
      if (t.text.empty()) {
        if (kOneCharOperators.find(c) == std::string_view::npos) {
          return ErrorAt(*line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
        t.text = std::string(1, c);
      }
      pos += t.text.size();
      if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
      if (t.text == ")" || t.text == "]" || t.text == "}") depth = std::max(0, depth - 1);
    }
    out->push_back(std::move(t));
  }
}

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  // Jinja drops one newline at the template's end.
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);
  std::vector<Token> out;
  size_t pos = 0;
  int line = 1;
  while (true) {
    size_t open = pos;
    while ((open = source.find('{', open)) != std::string_view::npos) {
      if (open + 1 < source.size() && (source[open + 1] == '{' || source[open + 1] == '%' || source[open + 1] == '#')) {
        break;
      }
      ++open;
    }
    const size_t text_end = open == std::string_view::npos ? source.size() : open;
    std::string text(source.substr(pos, text_end - pos));
    const int text_line = line;
    line += CountLines(text);
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back(Token{Token::Kind::kText, std::move(text), 0, 0, text_line});
      break;
    }
    const char tag = source[open + 1];
    const char left = open + 2 < source.size() ? source[open + 2] : 0;
    if (left == '-') {
      while (!text.empty() && IsSpace(text.back())) text.pop_back();
    } else if (tag != '{' && left != '+') {
      // lstrip_blocks: only spaces and tabs between the line's start and the tag.
      const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      const bool at_line_start = line_start > 0 || pos == 0 || source[pos - 1] == '\n';
      if (at_line_start && text.find_first_not_of(" \t", line_start) == std::string::npos) text.resize(line_start);
    }
    if (!text.empty()) out.push_back(Token{Token::Kind::kText, std::move(text), 0, 0, text_line});
    size_t inside = open + 2 + (left == '-' || left == '+' ? 1 : 0);

    TagEnd end;
    if (tag == '#') {
      const size_t close = source.find("#}", inside);
      if (close == std::string_view::npos) return ErrorAt(line, "a comment '{#' is never closed with '#}'");
      line += CountLines(source.substr(open, close - open));
      const char before = close > inside ? source[close - 1] : 0;
      end = TagEnd{close + 2, before == '-' || before == '+' ? before : char{0}};
    } else {
      const bool expr = tag == '{';
      out.push_back(Token{expr ? Token::Kind::kExprOpen : Token::Kind::kStmtOpen, "", 0, 0, line});
      auto tag_end = TokenizeTag(source, inside, expr ? "}}" : "%}", &line, &out);
      if (!tag_end.ok()) return tag_end.status();
      end = *tag_end;
      out.push_back(Token{expr ? Token::Kind::kExprClose : Token::Kind::kStmtClose, "", 0, 0, line});
    }
    pos = end.pos;
    if (end.modifier == '-') {
      while (pos < source.size() && IsSpace(source[pos])) {
        if (source[pos] == '\n') ++line;
        ++pos;
      }
    } else if (tag != '{' && end.modifier != '+' && pos < source.size() && source[pos] == '\n') {
      ++pos;  // trim_blocks
      ++line;
    }
  }
  out.push_back(Token{Token::Kind::kEnd, "", 0, 0, line});
  return out;
}

}  // namespace lamina::jinja
