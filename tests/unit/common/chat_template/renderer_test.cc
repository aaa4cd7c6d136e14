#include "common/chat_template/renderer.h"

#include <fstream>
#include <string>

#include "common/chat_template/lexer.h"
#include "common/chat_template/parser.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lamina::jinja {
namespace {

// JSON to template values; ordered_json keeps the keys' order, as Python's dicts do.
Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& item : j) items.push_back(FromJson(item));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict items;
      for (const auto& [key, item] : j.items()) items.emplace_back(key, FromJson(item));
      return Value::Dict(std::move(items));
    }
    default:
      return Value();
  }
}

absl::StatusOr<std::string> RenderText(const std::string& source, const ValueDict& variables) {
  absl::StatusOr<std::vector<Token>> tokens = Tokenize(source);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<Body> body = Parse(*tokens);
  if (!body.ok()) return body.status();
  return Render(*body, variables);
}

// cases.json: chat templates and small programs rendered by Jinja2 itself, in the environment
// transformers renders chat templates in (tests/data/chat_templates/make_cases.py).
TEST(RendererTest, MatchesJinja2OnEveryGoldenCase) {
  std::ifstream in(std::string(LAMINA_SOURCE_DIR) + "/tests/data/chat_templates/cases.json");
  ASSERT_TRUE(in) << "cannot open cases.json";
  const nlohmann::ordered_json golden = nlohmann::ordered_json::parse(in);
  int rendered = 0, refused = 0;
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ValueDict variables;
    for (const auto& [name, value] : c["variables"].items()) variables.emplace_back(name, FromJson(value));
    absl::StatusOr<std::string> text = RenderText(c["template"].get<std::string>(), variables);
    if (c.contains("error")) {
      EXPECT_FALSE(text.ok()) << "Jinja2 failed with: " << c["error"] << "; we rendered: " << *text;
      ++refused;
    } else {
      ASSERT_TRUE(text.ok()) << text.status();
      EXPECT_EQ(*text, c["expected"].get<std::string>());
      ++rendered;
    }
  }
  EXPECT_GE(rendered, 25);
  EXPECT_GE(refused, 10);
}

TEST(RendererTest, ErrorsNameTheLineAndWhatIsWrong) {
  const ValueDict variables = {{"d", Value::Dict({{"a", Value(1)}})}};
  const struct {
    std::string source;
    std::string message;
  } cases[] = {
      {"line one\n{{ nothing.field }}", "line 2: 'nothing' is undefined"},
      {"\n\n{{ d.missing.deeper }}", "line 3: 'dict object' has no attribute 'missing'"},
      {"{{ 'a' | no_such_filter }}", "line 1: no filter named 'no_such_filter'"},
      {"{% if true %}\n\nnever closed", "line 3: '{% if %}' of line 1 is never closed"},
      {"{{ 1 $ 2 }}", "line 1: unexpected character '$'"},
      {"\n{{ 1 + ", "line 2: a tag is never closed with '}}'"},
      {"{{ 'a' + 1 }}", "line 1: cannot apply '+' to a string and a integer"},
      {"{% set d.x = 1 %}", "only a namespace() can change"},
      {"{{ 1 // 0 }}", "division by zero"},
      {"{% endfor %}", "line 1: '{% endfor %}' has no opening tag"},
      {"{% macro m(a) %}{{ m(a) }}{% endmacro %}{{ m(1) }}", "macros nest over 64 deep"},
      {"{{ range(1000000) }}", "range() is over 100000 long"},
      {"{% break %}", "break or continue outside a for loop"},
      {"{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}", "nests over 200 deep"},
      {"{{ " + std::string(300, '-') + "1 }}", "nests over 200 deep"},
      {"{{ 'x' * 100000000 }}", "a string would pass 16 MiB"},
      {"{% set ns = namespace(s='x' * 1000000) %}{% for i in range(5) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "16 MiB"},
      {"{{ 3 ** 100 }}", "integer overflow"},
      {"{{ 'a b'.split(7) }}", "split() needs a nonempty string separator"},
      {"{{ 'a b'.split('') }}", "split() needs a nonempty string separator"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
      {"{{ 'abc' | replace('b', 'x' * 10000000) * 2 }}", "16 MiB"},
      {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran over 5000000 steps"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::string> text = RenderText(c.source, variables);
    ASSERT_FALSE(text.ok()) << c.source;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
    EXPECT_NE(std::string(text.status().message()).find(c.message), std::string::npos)
        << c.source << " gave: " << text.status();
  }
}

TEST(RendererTest, RaiseExceptionIsFailedPreconditionWithTheTemplatesMessage) {
  absl::StatusOr<std::string> text = RenderText("\n{{ raise_exception('roles must alternate') }}", {});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(text.status().message(), "line 2: roles must alternate");
}

TEST(RendererTest, GenerationBlocksRenderTheirBodyAndVariablesHideGlobals) {
  // transformers marks assistant text with {% generation %}; it renders as the body.
  absl::StatusOr<std::string> text =
      RenderText("{% generation %}[{{ range }}]{% endgeneration %}", {{"range", Value("mine")}});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "[mine]");
}

TEST(RendererTest, StrftimeNowFormatsTheLocalTime) {
  absl::StatusOr<std::string> text = RenderText("{{ strftime_now('%Y') }}", {});
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_EQ(text->size(), 4u);
  EXPECT_GE(std::stoi(*text), 2024);
}

}  // namespace
}  // namespace lamina::jinja
