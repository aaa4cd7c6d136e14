// Splits a Jinja template into tokens: text between tags, and the tokens of each `{{ ... }}` and
// `{% ... %}` between their open and close markers. Comments `{# ... #}` are dropped.
//
// Whitespace is handled as Hugging Face renders chat templates (trim_blocks and lstrip_blocks on):
// the newline right after a `%}` or `#}` is dropped; spaces and tabs from a line's start to a `{%`
// or `{#` are dropped; `-` inside a marker (`{%-`, `-%}`, `{{-`, `-}}`) strips all whitespace on
// that side; `+` (`{%+`, `+%}`) keeps it. Pure function; thread-safe.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_LEXER_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::jinja {

struct Token {
  enum class Kind {
    kText,       // text: literal output
    kExprOpen,   // {{
    kExprClose,  // }}
    kStmtOpen,   // {%
    kStmtClose,  // %}
    kName,       // text: an identifier or keyword
    kString,     // text: the string's value, escapes resolved
    kInt,        // int_value
    kFloat,      // float_value
    kOperator,   // text: + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } , . : |
    kEnd,        // end of the template
  };
  Kind kind;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;  // 1-based line of the template the token starts on
};

// InvalidArgument names the line of an unclosed tag or string, or a character no token starts with.
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace lamina::jinja

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_LEXER_H_
