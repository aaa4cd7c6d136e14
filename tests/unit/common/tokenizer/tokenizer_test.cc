#include "common/tokenizer/tokenizer.h"

#include <string>
#include <vector>

#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"

namespace lamina {
namespace {

using ::lamina::testing::LoadGoldenJson;
using ::lamina::testing::ModelDir;

class TokenizerGoldenTest : public ::testing::TestWithParam<std::string> {};
// The models whose golden.json has tokenizer test strings.
class TokenizerStringsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerStringsTest, EncodesAndDecodesEveryGoldenString) {
  auto tokenizer = Tokenizer::Load(ModelDir(GetParam()));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  nlohmann::json golden = LoadGoldenJson(GetParam());
  int checked = 0;
  for (const auto& entry : golden["tokenizer"]) {
    const std::string text = entry["text"];
    const std::vector<int32_t> expected = entry["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer->Encode(text), expected) << "text: " << text;
    EXPECT_EQ(tokenizer->Decode(expected), entry["decoded"].get<std::string>()) << "text: " << text;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST_P(TokenizerGoldenTest, PromptsGetBosAndGoldenIds) {
  auto tokenizer = Tokenizer::Load(ModelDir(GetParam()));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  nlohmann::json golden = LoadGoldenJson(GetParam());
  for (const auto& prompt : golden["prompts"]) {
    EXPECT_EQ(tokenizer->EncodePrompt(prompt["text"].get<std::string>()),
              prompt["ids"].get<std::vector<int32_t>>());
  }
}

TEST_P(TokenizerGoldenTest, IncrementalDecodingMatchesWholeDecodeAndNeverSplitsCharacters) {
  auto tokenizer = Tokenizer::Load(ModelDir(GetParam()));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = "unicode: café naïve Übermaß 東京 🚀✨ and plain words";
  std::vector<int32_t> ids = tokenizer->Encode(text);
  IncrementalDecoder decoder(&*tokenizer, /*at_text_start=*/true);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = decoder.Add(id);
    EXPECT_EQ(utf8::Sanitize(piece), piece) << "piece is not whole UTF-8 characters";
    streamed += piece;
  }
  streamed += decoder.Finish();
  EXPECT_EQ(streamed, tokenizer->Decode(ids));
  EXPECT_EQ(streamed, text);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TokenizerStringsTest, ::testing::Values("tiny-llama2", "tiny-llama3"));
INSTANTIATE_TEST_SUITE_P(AllModels, TokenizerGoldenTest,
                         ::testing::Values("tiny-llama2", "tiny-llama3", "lamina-demo-6m"));

TEST(TokenizerTest, GreedyContinuationDecodesToGoldenText) {
  auto tokenizer = Tokenizer::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  for (const auto& prompt : golden["prompts"]) {
    std::vector<int32_t> ids = prompt["greedy_ids"].get<std::vector<int32_t>>();
    IncrementalDecoder decoder(&*tokenizer, /*at_text_start=*/false);
    std::string text;
    for (int32_t id : ids) text += decoder.Add(id);
    text += decoder.Finish();
    EXPECT_EQ(text, prompt["greedy_text"].get<std::string>());
  }
}

TEST(TokenizerTest, HeldBackBytesOfAnUnfinishedCharacterComeOutWhenComplete) {
  auto tokenizer = Tokenizer::Load(ModelDir("tiny-llama3"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // In the byte-level vocabulary each byte of 東 (e6 9d b1) is its own token here.
  std::vector<int32_t> ids = tokenizer->Encode("東");
  ASSERT_GE(ids.size(), 2u);
  IncrementalDecoder decoder(&*tokenizer, true);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) out += decoder.Add(ids[i]);
  EXPECT_EQ(out, "");
  out += decoder.Add(ids.back());
  EXPECT_EQ(out, "東");
}

TEST(TokenizerTest, UnfinishedCharacterAtTheEndBecomesReplacementCharacter) {
  auto tokenizer = Tokenizer::Load(ModelDir("tiny-llama3"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<int32_t> ids = tokenizer->Encode("東");
  ASSERT_GE(ids.size(), 2u);
  IncrementalDecoder decoder(&*tokenizer, true);
  EXPECT_EQ(decoder.Add(ids[0]), "");
  EXPECT_EQ(decoder.Finish(), "\xef\xbf\xbd");
}

TEST(TokenizerTest, SpecialTokensInTextAreMatchedAndSkippableWhenDecoding) {
  auto tokenizer = Tokenizer::Load(ModelDir("tiny-llama3"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<int32_t> ids = tokenizer->Encode("<|begin_of_text|>Hello world<|eot_id|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 509);
  EXPECT_EQ(ids.back(), 511);
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/true), "Hello world");
  EXPECT_EQ(tokenizer->Decode(ids), "<|begin_of_text|>Hello world<|eot_id|>");
}

// A SentencePiece-style tokenizer with a Metaspace pre-tokenizer (the newer Mistral and TinyLlama
// layout), built inline: "▁" + "a" merge into "▁a", and a character outside the vocabulary falls
// back to its bytes.
TEST(TokenizerTest, MetaspacePreTokenizerWithByteFallback) {
  const std::string json = R"json({
    "normalizer": null,
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "ByteFallback"},
      {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false}]},
    "added_tokens": [{"id": 0, "content": "<s>", "special": true}],
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": null,
              "vocab": {"<s>": 0, "\u2581": 1, "a": 2, "b": 3, "\u2581a": 4, "\u2581ab": 5, "<0x21>": 6},
              "merges": [["\u2581", "a"], ["\u2581a", "b"]]}})json";
  auto tokenizer = Tokenizer::FromJson(json, "metaspace.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->Encode("ab a!"), (std::vector<int32_t>{5, 4, 6}));
  EXPECT_EQ(tokenizer->Decode({5, 4, 6}), "ab a!");
  // "first": only the text's first segment gets the prefix, not the text after a special token.
  EXPECT_EQ(tokenizer->Encode("<s>ab"), (std::vector<int32_t>{0, 2, 3}));
}

// Qwen2 style: NFC normalisation before a byte-level BPE whose split regex takes digits one at a
// time. The vocabulary is every printable ASCII byte plus the byte-level forms of é's two bytes.
TEST(TokenizerTest, NfcNormalizerAndQwen2SplitRegex) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0x21; b <= 0x7e; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
  vocab["\u00c3"] = 200;  // byte 0xc3
  vocab["\u00a9"] = 201;  // byte 0xa9
  vocab["\u0120"] = 202;  // byte 0x20 (space)
  nlohmann::json json = nlohmann::json::parse(R"json({
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "behavior": "Isolated", "pattern": {"Regex":
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "merges": []}})json");
  json["model"]["vocab"] = vocab;
  auto tokenizer = Tokenizer::FromJson(json.dump(), "qwen2.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // e + combining acute accent (decomposed) becomes é (c3 a9) before encoding.
  EXPECT_EQ(tokenizer->Encode("e\xcc\x81"), (std::vector<int32_t>{200, 201}));
  EXPECT_EQ(tokenizer->Encode("123"), (std::vector<int32_t>{'1', '2', '3'}));
  EXPECT_EQ(tokenizer->Encode("a 12"), (std::vector<int32_t>{'a', 202, '1', '2'}));
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode("a 12")), "a 12");
}

TEST(TokenizerTest, MalformedFilesAreRejectedWithTheFileName) {
  struct Case {
    std::string json;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"{not json", "not valid JSON"},
      {"[]", "not a JSON object"},
      {R"({"model": {"type": "WordPiece", "vocab": {}}})", "only BPE"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}})", "missing from the vocab"},
      {R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "no valid id"},
      {R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}}, "model": {"type": "BPE", "vocab": {}, "merges": []}})",
       "does not compile"},
      {R"({"normalizer": {"type": "Precompiled"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})",
       "not supported"},
      {R"({"pre_tokenizer": {"type": "ByteLevel", "use_regex": "yes"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})",
       "malformed"},
  };
  for (const Case& c : cases) {
    auto tokenizer = Tokenizer::FromJson(c.json, "bad/tokenizer.json");
    ASSERT_FALSE(tokenizer.ok()) << c.json;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(tokenizer.status().message().find("bad/tokenizer.json"), std::string::npos) << tokenizer.status();
    EXPECT_NE(tokenizer.status().message().find(c.expected), std::string::npos) << tokenizer.status();
  }
}

}  // namespace
}  // namespace lamina
