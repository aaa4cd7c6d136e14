#include "common/chat_template/parser.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"

namespace lamina::jinja {
namespace {

// Deeper nesting than any template needs; the parser and renderer recurse once a level.
constexpr int kMaxNesting = 200;

using ExprPtr = std::unique_ptr<Expr>;

ExprPtr MakeExpr(Expr::Kind kind, int line, std::string name = "") {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  e->name = std::move(name);
  return e;
}

ExprPtr MakeBinary(std::string op, ExprPtr left, ExprPtr right) {
  ExprPtr e = MakeExpr(Expr::Kind::kBinary, left->line, std::move(op));
  e->args.push_back(std::move(left));
  e->args.push_back(std::move(right));
  return e;
}

std::string Describe(const Token& t) {
  switch (t.kind) {
    case Token::Kind::kText:
      return "text";
    case Token::Kind::kExprOpen:
      return "'{{'";
    case Token::Kind::kExprClose:
      return "'}}'";
    case Token::Kind::kStmtOpen:
      return "'{%'";
    case Token::Kind::kStmtClose:
      return "'%}'";
    case Token::Kind::kString:
      return "a string";
    case Token::Kind::kInt:
    case Token::Kind::kFloat:
      return absl::StrCat("the number ", t.text);
    case Token::Kind::kEnd:
      return "the end of the template";
    default:
      return absl::StrCat("'", t.text, "'");
  }
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  // Parses nodes until a `{% name %}` tag whose name is one of `enders` (consuming `{%` and the
  // name) or, with no enders, the template's end. `opened` names the tag being closed, for errors.
  absl::StatusOr<Body> ParseBody(const std::vector<std::string>& enders, std::string* ended_by,
                                 const std::string& opened = "", int opened_line = 0) {
    Nested nested(this);
    if (depth_ > kMaxNesting) return Error(Peek(), absl::StrCat("tags nest over ", kMaxNesting, " deep"));
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == Token::Kind::kEnd) {
        if (enders.empty()) return body;
        return Error(t, absl::StrCat("'{% ", opened, " %}' of line ", opened_line, " is never closed with '{% ",
                                     absl::StrJoin(enders, " %}' or '{% "), " %}'"));
      }
      if (t.kind == Token::Kind::kText) {
        auto node = MakeNode(Node::Kind::kText, t.line);
        node->text = t.text;
        body.push_back(std::move(node));
        ++i_;
      } else if (t.kind == Token::Kind::kExprOpen) {
        ++i_;
        auto node = MakeNode(Node::Kind::kOutput, t.line);
        LAMINA_ASSIGN_OR_RETURN(node->expr, ParseExpr());
        LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kExprClose));
        body.push_back(std::move(node));
      } else if (t.kind == Token::Kind::kStmtOpen) {
        const Token& name = Peek(1);
        if (name.kind != Token::Kind::kName)
          return Error(name, "a tag must start with a name, found " + Describe(name));
        for (const std::string& ender : enders) {
          if (name.text == ender) {
            *ended_by = ender;
            i_ += 2;
            return body;
          }
        }
        i_ += 2;
        LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<Node> node, ParseStatement(name));
        body.push_back(std::move(node));
      } else {
        return Error(t, "unexpected " + Describe(t));
      }
    }
  }

 private:
  // Counts one level of recursion for as long as it lives.
  struct Nested {
    explicit Nested(Parser* p) : parser(p) { ++parser->depth_; }
    ~Nested() { --parser->depth_; }
    Parser* parser;
  };

  static std::unique_ptr<Node> MakeNode(Node::Kind kind, int line) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = line;
    return n;
  }

  const Token& Peek(size_t ahead = 0) const { return tokens_[std::min(i_ + ahead, tokens_.size() - 1)]; }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kOperator && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kName && Peek(ahead).text == name;
  }
  static absl::Status Error(const Token& at, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("line ", at.line, ": ", what));
  }
  absl::Status Expect(Token::Kind kind) {
    if (Peek().kind != kind) {
      Token want;
      want.kind = kind;
      return Error(Peek(), absl::StrCat("expected ", Describe(want), ", found ", Describe(Peek())));
    }
    ++i_;
    return absl::OkStatus();
  }
  absl::Status ExpectOp(const std::string& op) {
    if (!IsOp(op)) return Error(Peek(), absl::StrCat("expected '", op, "', found ", Describe(Peek())));
    ++i_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Token::Kind::kName) return Error(Peek(), "expected a name, found " + Describe(Peek()));
    return tokens_[i_++].text;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseStatement(const Token& tag) {
    const std::string& name = tag.text;
    if (name == "if") return ParseIf(tag);
    if (name == "for") return ParseFor(tag);
    if (name == "set") return ParseSet(tag);
    if (name == "macro") return ParseMacro(tag);
    if (name == "break" || name == "continue") {
      LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
      return MakeNode(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, tag.line);
    }
    if (name == "generation") {
      LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
      auto node = MakeNode(Node::Kind::kBlock, tag.line);
      std::string ended;
      LAMINA_ASSIGN_OR_RETURN(node->body, ParseBody({"endgeneration"}, &ended, name, tag.line));
      LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
      return node;
    }
    for (const char* closer : {"elif", "else", "endif", "endfor", "endset", "endmacro", "endgeneration"}) {
      if (name == closer) return Error(tag, absl::StrCat("'{% ", name, " %}' has no opening tag"));
    }
    return Error(tag, absl::StrCat("unknown tag '", name, "'"));
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseIf(const Token& tag) {
    auto node = MakeNode(Node::Kind::kIf, tag.line);
    LAMINA_ASSIGN_OR_RETURN(ExprPtr condition, ParseExpr());
    while (true) {
      LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
      std::string ended;
      LAMINA_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &ended, "if", tag.line));
      node->branches.emplace_back(std::move(condition), std::move(body));
      if (ended == "endif") break;
      if (ended == "elif") {
        LAMINA_ASSIGN_OR_RETURN(condition, ParseExpr());
        continue;
      }
      LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
      LAMINA_ASSIGN_OR_RETURN(Body else_body, ParseBody({"endif"}, &ended, "if", tag.line));
      node->branches.emplace_back(nullptr, std::move(else_body));
      break;
    }
    LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
    return node;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseFor(const Token& tag) {
    auto node = MakeNode(Node::Kind::kFor, tag.line);
    do {
      LAMINA_ASSIGN_OR_RETURN(std::string target, ExpectName());
      node->targets.push_back(std::move(target));
    } while (IsOp(",") && (++i_, true));
    if (!IsName("in")) return Error(Peek(), "expected 'in' in a for loop, found " + Describe(Peek()));
    ++i_;
    LAMINA_ASSIGN_OR_RETURN(node->expr, ParseOr());
    if (IsName("if")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(node->filter, ParseExpr());
    }
    if (IsName("recursive")) return Error(Peek(), "recursive for loops are not supported");
    LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
    std::string ended;
    LAMINA_ASSIGN_OR_RETURN(node->body, ParseBody({"else", "endfor"}, &ended, "for", tag.line));
    if (ended == "else") {
      LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
      LAMINA_ASSIGN_OR_RETURN(node->else_body, ParseBody({"endfor"}, &ended, "for", tag.line));
    }
    LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
    return node;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseSet(const Token& tag) {
    auto node = MakeNode(Node::Kind::kSet, tag.line);
    LAMINA_ASSIGN_OR_RETURN(std::string target, ExpectName());
    node->targets.push_back(std::move(target));
    if (IsOp(".")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(node->attr, ExpectName());
    } else {
      while (IsOp(",")) {
        ++i_;
        LAMINA_ASSIGN_OR_RETURN(std::string more, ExpectName());
        node->targets.push_back(std::move(more));
      }
    }
    if (Peek().kind == Token::Kind::kStmtClose && node->targets.size() == 1 && node->attr.empty()) {
      ++i_;  // {% set x %}...{% endset %}
      std::string ended;
      LAMINA_ASSIGN_OR_RETURN(node->body, ParseBody({"endset"}, &ended, "set", tag.line));
      LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
      return node;
    }
    LAMINA_RETURN_IF_ERROR(ExpectOp("="));
    LAMINA_ASSIGN_OR_RETURN(node->expr, ParseTupleOrExpr());
    LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
    return node;
  }

  absl::StatusOr<std::unique_ptr<Node>> ParseMacro(const Token& tag) {
    auto node = MakeNode(Node::Kind::kMacro, tag.line);
    LAMINA_ASSIGN_OR_RETURN(node->name, ExpectName());
    LAMINA_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      LAMINA_ASSIGN_OR_RETURN(std::string param, ExpectName());
      ExprPtr fallback;
      if (IsOp("=")) {
        ++i_;
        LAMINA_ASSIGN_OR_RETURN(fallback, ParseExpr());
      }
      node->params.emplace_back(std::move(param), std::move(fallback));
      if (!IsOp(",")) break;
      ++i_;
    }
    LAMINA_RETURN_IF_ERROR(ExpectOp(")"));
    LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
    std::string ended;
    LAMINA_ASSIGN_OR_RETURN(node->body, ParseBody({"endmacro"}, &ended, "macro", tag.line));
    LAMINA_RETURN_IF_ERROR(Expect(Token::Kind::kStmtClose));
    return node;
  }

  // `a, b` (a list) where a set's value may be a tuple; else one expression.
  absl::StatusOr<ExprPtr> ParseTupleOrExpr() {
    const int line = Peek().line;
    LAMINA_ASSIGN_OR_RETURN(ExprPtr first, ParseExpr());
    if (!IsOp(",")) return first;
    ExprPtr list = MakeExpr(Expr::Kind::kList, line, "tuple");
    list->args.push_back(std::move(first));
    while (IsOp(",")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
      list->args.push_back(std::move(item));
    }
    return list;
  }

 public:
  absl::StatusOr<ExprPtr> ParseExpr() {
    Nested nested(this);
    if (depth_ > kMaxNesting) return Error(Peek(), absl::StrCat("an expression nests over ", kMaxNesting, " deep"));
    LAMINA_ASSIGN_OR_RETURN(ExprPtr value, ParseOr());
    if (!IsName("if")) return value;
    ++i_;
    ExprPtr e = MakeExpr(Expr::Kind::kIf, value->line);
    LAMINA_ASSIGN_OR_RETURN(ExprPtr condition, ParseOr());
    ExprPtr otherwise;
    if (IsName("else")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(otherwise, ParseExpr());
    }
    e->args.push_back(std::move(value));
    e->args.push_back(std::move(condition));
    e->args.push_back(std::move(otherwise));
    return e;
  }

 private:
  absl::StatusOr<ExprPtr> ParseOr() {
    LAMINA_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = MakeBinary("or", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    LAMINA_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = MakeBinary("and", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    Nested nested(this);
    if (depth_ > kMaxNesting) return Error(Peek(), absl::StrCat("an expression nests over ", kMaxNesting, " deep"));
    const int line = Peek().line;
    ++i_;
    ExprPtr e = MakeExpr(Expr::Kind::kUnary, line, "not");
    LAMINA_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    e->args.push_back(std::move(operand));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    LAMINA_ASSIGN_OR_RETURN(ExprPtr left, ParseSum());
    while (true) {
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">=")) {
        op = Peek().text;
        ++i_;
      } else if (IsName("in")) {
        op = "in";
        ++i_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        i_ += 2;
      } else {
        return left;
      }
      LAMINA_ASSIGN_OR_RETURN(ExprPtr right, ParseSum());
      left = MakeBinary(op, std::move(left), std::move(right));
    }
  }

  absl::StatusOr<ExprPtr> ParseSum() {
    LAMINA_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      std::string op = tokens_[i_++].text;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = MakeBinary(op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    LAMINA_ASSIGN_OR_RETURN(ExprPtr left, ParseProduct());
    while (IsOp("~")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr right, ParseProduct());
      left = MakeBinary("~", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseProduct() {
    LAMINA_ASSIGN_OR_RETURN(ExprPtr left, ParsePower());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = tokens_[i_++].text;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr right, ParsePower());
      left = MakeBinary(op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePower() {
    LAMINA_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = MakeBinary("**", std::move(left), std::move(right));
    }
    return left;
  }

  // As Jinja: `-x | abs` filters -x; `-x.y` negates x.y.
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filters) {
    Nested nested(this);
    if (depth_ > kMaxNesting) return Error(Peek(), absl::StrCat("an expression nests over ", kMaxNesting, " deep"));
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = MakeExpr(Expr::Kind::kUnary, Peek().line, tokens_[i_].text);
      ++i_;
      LAMINA_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node->args.push_back(std::move(operand));
    } else {
      LAMINA_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    LAMINA_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (!with_filters) return node;
    return ParseFiltersAndTests(std::move(node));
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    switch (t.kind) {
      case Token::Kind::kName: {
        ++i_;
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::kString: {
        std::string text;
        while (Peek().kind == Token::Kind::kString) text += tokens_[i_++].text;  // "a" "b" is "ab"
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral, t.line);
        e->literal = Value(std::move(text));
        return e;
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat: {
        ++i_;
        ExprPtr e = MakeExpr(Expr::Kind::kLiteral, t.line);
        e->literal = t.kind == Token::Kind::kInt ? Value(t.int_value) : Value(t.float_value);
        return e;
      }
      case Token::Kind::kOperator:
        if (t.text == "(") {
          ++i_;
          ExprPtr list = MakeExpr(Expr::Kind::kList, t.line);
          bool tuple = false;
          while (!IsOp(")")) {
            LAMINA_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
            list->args.push_back(std::move(item));
            if (!IsOp(",")) break;
            tuple = true;
            ++i_;
          }
          LAMINA_RETURN_IF_ERROR(ExpectOp(")"));
          if (!tuple && list->args.size() == 1) return std::move(list->args[0]);
          list->name = "tuple";
          return list;
        }
        if (t.text == "[") {
          ++i_;
          ExprPtr list = MakeExpr(Expr::Kind::kList, t.line);
          while (!IsOp("]")) {
            LAMINA_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
            list->args.push_back(std::move(item));
            if (!IsOp(",")) break;
            ++i_;
          }
          LAMINA_RETURN_IF_ERROR(ExpectOp("]"));
          return list;
        }
        if (t.text == "{") {
          ++i_;
          ExprPtr dict = MakeExpr(Expr::Kind::kDict, t.line);
          while (!IsOp("}")) {
            LAMINA_ASSIGN_OR_RETURN(ExprPtr key, ParseExpr());
            LAMINA_RETURN_IF_ERROR(ExpectOp(":"));
            LAMINA_ASSIGN_OR_RETURN(ExprPtr value, ParseExpr());
            dict->args.push_back(std::move(key));
            dict->args.push_back(std::move(value));
            if (!IsOp(",")) break;
            ++i_;
          }
          LAMINA_RETURN_IF_ERROR(ExpectOp("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    return Error(t, "expected a value, found " + Describe(t));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        ++i_;
        const Token& t = Peek();
        if (t.kind == Token::Kind::kInt) {  // x.0 is x[0]
          ++i_;
          ExprPtr index = MakeExpr(Expr::Kind::kLiteral, t.line);
          index->literal = Value(t.int_value);
          ExprPtr e = MakeExpr(Expr::Kind::kIndex, t.line);
          e->args.push_back(std::move(node));
          e->args.push_back(std::move(index));
          node = std::move(e);
          continue;
        }
        LAMINA_ASSIGN_OR_RETURN(std::string attr, ExpectName());
        ExprPtr e = MakeExpr(Expr::Kind::kAttr, t.line, std::move(attr));
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        LAMINA_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        ExprPtr call = MakeExpr(Expr::Kind::kCall, Peek().line);
        call->args.push_back(std::move(node));
        LAMINA_RETURN_IF_ERROR(ParseCallArgs(call.get()));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const int line = Peek().line;
    ++i_;  // [
    ExprPtr start;
    if (!IsOp(":")) {
      LAMINA_ASSIGN_OR_RETURN(start, ParseExpr());
    }
    if (!IsOp(":")) {
      LAMINA_RETURN_IF_ERROR(ExpectOp("]"));
      ExprPtr e = MakeExpr(Expr::Kind::kIndex, line);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(start));
      return e;
    }
    ++i_;
    ExprPtr stop, step;
    if (!IsOp(":") && !IsOp("]")) {
      LAMINA_ASSIGN_OR_RETURN(stop, ParseExpr());
    }
    if (IsOp(":")) {
      ++i_;
      if (!IsOp("]")) {
        LAMINA_ASSIGN_OR_RETURN(step, ParseExpr());
      }
    }
    LAMINA_RETURN_IF_ERROR(ExpectOp("]"));
    ExprPtr e = MakeExpr(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(start));
    e->args.push_back(std::move(stop));
    e->args.push_back(std::move(step));
    return e;
  }

  // `(a, b, key=c)`: appends the arguments after the ones `call` already has.
  absl::Status ParseCallArgs(Expr* call) {
    LAMINA_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (Peek().kind == Token::Kind::kName && IsOp("=", 1)) {
        std::string key = tokens_[i_].text;
        i_ += 2;
        LAMINA_ASSIGN_OR_RETURN(ExprPtr value, ParseExpr());
        call->named.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call->named.empty()) return Error(Peek(), "a positional argument follows a keyword argument");
        LAMINA_ASSIGN_OR_RETURN(ExprPtr value, ParseExpr());
        call->args.push_back(std::move(value));
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParseFiltersAndTests(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        ++i_;
        const int line = Peek().line;
        LAMINA_ASSIGN_OR_RETURN(std::string name, ExpectName());
        ExprPtr e = MakeExpr(Expr::Kind::kFilter, line, std::move(name));
        e->args.push_back(std::move(node));
        if (IsOp("(")) LAMINA_RETURN_IF_ERROR(ParseCallArgs(e.get()));
        node = std::move(e);
      } else if (IsName("is")) {
        ++i_;
        const int line = Peek().line;
        const bool negated = IsName("not");
        if (negated) ++i_;
        LAMINA_ASSIGN_OR_RETURN(std::string name, ExpectName());
        ExprPtr e = MakeExpr(Expr::Kind::kTest, line, std::move(name));
        e->negated = negated;
        e->args.push_back(std::move(node));
        if (IsOp("(")) {
          LAMINA_RETURN_IF_ERROR(ParseCallArgs(e.get()));
        } else if (TakesBareTestArgument()) {  // `x is divisibleby 3`, `x is sameas false`
          LAMINA_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          LAMINA_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          e->args.push_back(std::move(arg));
        }
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  bool TakesBareTestArgument() const {
    const Token& t = Peek();
    if (t.kind == Token::Kind::kString || t.kind == Token::Kind::kInt || t.kind == Token::Kind::kFloat) return true;
    if (t.kind != Token::Kind::kName) return t.kind == Token::Kind::kOperator && (t.text == "[" || t.text == "{");
    for (const char* word : {"else", "or", "and", "if", "in", "is", "not"}) {
      if (t.text == word) return false;
    }
    return true;
  }

  const std::vector<Token>& tokens_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens) {
  Parser parser(tokens);
  std::string unused;
  return parser.ParseBody({}, &unused);
}

}  // namespace lamina::jinja
