#include "common/chat_template/value.h"

#include <limits>

#include "gtest/gtest.h"

namespace lamina::jinja {
namespace {

TEST(ValueTest, FloatsPrintAsPythonReprPrintsThem) {
  EXPECT_EQ(FloatRepr(1.0), "1.0");
  EXPECT_EQ(FloatRepr(-0.5), "-0.5");
  EXPECT_EQ(FloatRepr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FloatRepr(1e16), "1e+16");
  EXPECT_EQ(FloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(FloatRepr(0.0001), "0.0001");
  EXPECT_EQ(FloatRepr(0.00001), "1e-05");
  EXPECT_EQ(FloatRepr(1.5e-7), "1.5e-07");
  EXPECT_EQ(FloatRepr(123456.789), "123456.789");
  EXPECT_EQ(FloatRepr(2.5e300), "2.5e+300");
  EXPECT_EQ(FloatRepr(std::numeric_limits<double>::infinity()), "inf");
}

TEST(ValueTest, StrReprAndTruthFollowPython) {
  const Value list = Value::List({Value(1), Value("it's"), Value::None(), Value(true), Value(2.0)});
  EXPECT_EQ(list.ToString(), "[1, \"it's\", None, True, 2.0]");
  EXPECT_EQ(Value::Tuple({Value("a")}).Repr(), "('a',)");
  EXPECT_EQ(Value::Dict({{"k", Value("v\n")}}).Repr(), "{'k': 'v\\n'}");
  EXPECT_EQ(Value("text").ToString(), "text");
  EXPECT_EQ(Value("text").Repr(), "'text'");
  EXPECT_EQ(Value().ToString(), "");
  EXPECT_FALSE(Value().Truthy());
  EXPECT_FALSE(Value::None().Truthy());
  EXPECT_FALSE(Value(0).Truthy());
  EXPECT_FALSE(Value(0.0).Truthy());
  EXPECT_FALSE(Value("").Truthy());
  EXPECT_FALSE(Value::List({}).Truthy());
  EXPECT_FALSE(Value::Dict({}).Truthy());
  EXPECT_TRUE(Value(" ").Truthy());
  EXPECT_TRUE(Value::List({Value::None()}).Truthy());
}

TEST(ValueTest, ToJsonKeepsKeyOrderAndEscapesAsJsonDumps) {
  const Value v = Value::Dict(
      {{"z", Value(1)}, {"a", Value::List({Value(1.5), Value::None(), Value(false)})}, {"s", Value("q\"\\\n\t\x01é")}});
  absl::StatusOr<std::string> one_line = v.ToJson(-1);
  ASSERT_TRUE(one_line.ok()) << one_line.status();
  EXPECT_EQ(*one_line, "{\"z\": 1, \"a\": [1.5, null, false], \"s\": \"q\\\"\\\\\\n\\t\\u0001é\"}");
  absl::StatusOr<std::string> indented =
      Value::Dict({{"a", Value::List({Value(1)})}, {"b", Value::Dict({})}}).ToJson(2);
  ASSERT_TRUE(indented.ok());
  EXPECT_EQ(*indented, "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_FALSE(Value::Undefined("'x' is undefined").ToJson(-1).ok());
}

TEST(ValueTest, EqualityComparesNumbersByValueAndContainersByItem) {
  EXPECT_TRUE(Value(1).Equals(Value(1.0)));
  EXPECT_TRUE(Value(true).Equals(Value(1)));
  EXPECT_FALSE(Value("1").Equals(Value(1)));
  EXPECT_TRUE(Value::Dict({{"a", Value(1)}, {"b", Value(2)}}).Equals(Value::Dict({{"b", Value(2)}, {"a", Value(1)}})));
  EXPECT_FALSE(Value::List({Value(1)}).Equals(Value::List({Value(1), Value(2)})));
  EXPECT_TRUE(Value::None().Equals(Value::None()));
  EXPECT_FALSE(Value::None().Equals(Value()));
}

TEST(ValueTest, NamespacesChangeAndTheirCopiesSeeIt) {
  const Value ns = Value::Namespace({{"count", Value(0)}});
  const Value copy = ns;
  ns.SetField("count", Value(2));
  ns.SetField("added", Value("x"));
  ASSERT_NE(copy.Find("count"), nullptr);
  EXPECT_EQ(copy.Find("count")->int_value(), 2);
  ASSERT_NE(copy.Find("added"), nullptr);
  EXPECT_EQ(copy.Find("added")->str(), "x");
  EXPECT_TRUE(copy.is_namespace());
  EXPECT_FALSE(Value::Dict({}).is_namespace());
}

TEST(ValueTest, SplitCodePointsKeepsMultiByteCharactersWhole) {
  EXPECT_EQ(SplitCodePoints("hé日!"), (std::vector<std::string>{"h", "é", "日", "!"}));
  EXPECT_EQ(SplitCodePoints(std::string("a\xff", 2)), (std::vector<std::string>{"a", "\xff"}));
}

}  // namespace
}  // namespace lamina::jinja
