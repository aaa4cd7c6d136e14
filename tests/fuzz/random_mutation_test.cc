// Thousands of random mutations of real model files, run in every CI build (the libFuzzer
// programs go further where clang is available). Each mutation must be rejected with a Status or
// accepted with every invariant intact; a crash or an abort fails the test.
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina::fuzz {
namespace {

using ::lamina::testing::ModelDir;
using ::lamina::testing::ReadFileOrDie;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// Flips, overwrites, inserts or deletes a few bytes, or truncates; JSON-ish characters are
// favoured so that mutations reach the parsers' deeper paths.
std::string Mutate(const std::string& seed, size_t limit, std::mt19937_64& rng) {
  static const std::string kInteresting = "{}[]\":,-0123456789eE.\\ntrufalsn \xff\x80";
  std::string s = seed;
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t region = std::min(limit, s.size());
    if (region == 0) break;
    const size_t pos = rng() % region;
    switch (rng() % 6) {
      case 0:
        s[pos] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:
      case 2:
        s[pos] = kInteresting[rng() % kInteresting.size()];
        break;
      case 3:
        s.insert(pos, 1, kInteresting[rng() % kInteresting.size()]);
        break;
      case 4:
        s.erase(pos, 1 + rng() % 8);
        break;
      case 5:
        s.resize(pos + (s.size() - pos) / 2);
        break;
    }
  }
  return s;
}

size_t HeaderEnd(const std::string& safetensors) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(safetensors[i]);
  return 8 + n;
}

TEST(RandomMutationTest, SafetensorsHeaders) {
  const std::string seed = ReadFileOrDie(ModelDir("tiny-llama2") + "/model.safetensors");
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::string mutated = Mutate(seed, HeaderEnd(seed), rng);
    SafetensorsFile(Bytes(mutated), mutated.size());
  }
}

TEST(RandomMutationTest, ModelConfigs) {
  std::mt19937_64 rng(2);
  for (const char* model : {"tiny-llama2", "tiny-llama3", "lamina-demo-6m"}) {
    const std::string seed = ReadFileOrDie(ModelDir(model) + "/config.json");
    for (int i = 0; i < 10000; ++i) {
      std::string mutated = Mutate(seed, seed.size(), rng);
      ModelConfigJson(Bytes(mutated), mutated.size());
    }
  }
}

TEST(RandomMutationTest, TokenizerFiles) {
  std::mt19937_64 rng(3);
  for (const char* model : {"tiny-llama2", "tiny-llama3"}) {
    const std::string seed = ReadFileOrDie(ModelDir(model) + "/tokenizer.json");
    // The interesting structure (pre-tokenizer, decoder, added tokens) is in the first few KB.
    for (int i = 0; i < 2000; ++i) {
      std::string mutated = Mutate(seed, 6000, rng);
      TokenizerJson(Bytes(mutated), mutated.size());
    }
  }
}

TEST(RandomMutationTest, TokenizerTextRoundTrips) {
  std::mt19937_64 rng(4);
  const std::string alphabet[] = {"a", "Z", " ", "  ", "\n", "\t", "7", "'s", "é", "東", "🚀", "\xe2\x96\x81", ".", "ß", "\r\n"};
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    const int pieces = static_cast<int>(rng() % 24);
    for (int p = 0; p < pieces; ++p) text += alphabet[rng() % (sizeof(alphabet) / sizeof(alphabet[0]))];
    if (rng() % 4 == 0 && !text.empty()) text[rng() % text.size()] = static_cast<char>(rng());  // maybe invalid UTF-8
    TokenizerText(Bytes(text), text.size());
  }
}

}  // namespace
}  // namespace lamina::fuzz
