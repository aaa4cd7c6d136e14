// Parses Jinja tokens into a tree: the statements and expressions chat templates use.
//
// Statements: if/elif/else, for (one name or a tuple of names, an optional `if` filter, else,
// loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem), set (a name, a
// namespace field `ns.f`, or a block `{% set x %}...{% endset %}`), macro with defaults, break,
// continue, and `generation` blocks (rendered as their body).
// Expressions, by rising precedence: `a if c else b`; or; and; not; comparisons (== != < <= > >=
// in, not in); + -; ~; * / // %; **; unary - +; then literals, names, (a, b) tuples, [lists],
// {dicts}, and postfix .attr, [index], [a:b:c] slices, calls with keyword arguments, `| filter`
// and `is [not] test`. Pure; thread-compatible.
#ifndef LAMINA_COMMON_CHAT_TEMPLATE_PARSER_H_
#define LAMINA_COMMON_CHAT_TEMPLATE_PARSER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template/lexer.h"
#include "common/chat_template/value.h"

namespace lamina::jinja {

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: the items
    kDict,     // args: key, value, key, value, ...
    kAttr,     // args[0].name
    kIndex,    // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]], each bound null when left out
    kCall,     // args[0](args[1..], named)
    kFilter,   // args[0] | name(args[1..], named)
    kTest,     // args[0] is [not] name(args[1..]); negated for `is not`
    kUnary,    // name ("-", "+", "not") args[0]
    kBinary,   // args[0] name args[1]: arithmetic, comparisons, "in", "not in", "and", "or"
    kIf,       // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Value literal;
  bool negated = false;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> named;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches: (condition, body)...; a null condition is the else
    kFor,     // for targets in expr [if filter]: body, else_body
    kSet,     // set targets[0] (or targets[0].attr) = expr; with a null expr, set to the rendered body
    kMacro,   // macro name(params): body
    kBreak,
    kContinue,
    kBlock,  // a body rendered as it is (generation blocks)
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::unique_ptr<Expr> expr;
  std::vector<std::pair<std::unique_ptr<Expr>, Body>> branches;
  std::vector<std::string> targets;
  std::string attr;
  std::unique_ptr<Expr> filter;
  Body body;
  Body else_body;
  std::string name;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> params;  // defaults may be null
};

// InvalidArgument names the line and what was expected there.
absl::StatusOr<Body> Parse(const std::vector<Token>& tokens);

}  // namespace lamina::jinja

#endif  // LAMINA_COMMON_CHAT_TEMPLATE_PARSER_H_
