// Thousands of random mutations of real model files, run in every CI build (the libFuzzer
// programs go further where clang is available). Each mutation must be rejected with a Status or
// accepted with every invariant intact; a crash or an abort fails the test.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "common/transport/wire.h"
#include "gtest/gtest.h"
#include "lamina/v1/generation.pb.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina::fuzz {
namespace {

using ::lamina::testing::ModelDir;
using ::lamina::testing::ReadFileOrDie;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

const std::string kJsonCharacters = "{}[]\":,-0123456789eE.\\ntrufalsn \xff\x80";
const std::string kJinjaCharacters = "{}%#-+()[]|.,:'\"~=*/ \n0123456789\\\xff";

// Flips, overwrites, inserts or deletes a few bytes, or truncates; `interesting` characters (JSON's
// by default) are favoured so that mutations reach the parsers' deeper paths.
std::string Mutate(const std::string& seed, size_t limit, std::mt19937_64& rng,
                   const std::string& interesting = kJsonCharacters) {
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
        s[pos] = interesting[rng() % interesting.size()];
        break;
      case 3:
        s.insert(pos, 1, interesting[rng() % interesting.size()]);
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

// Mutations of a valid seed: a parser that works accepts some (those that left the structure whole)
// and refuses some; one that accepts none has stopped working, one that refuses none checks nothing.
struct Tally {
  int accepted = 0, total = 0;
  void Count(bool accepted_one) {
    accepted += accepted_one ? 1 : 0;
    ++total;
  }
};

void ExpectSomeAcceptedAndSomeRefused(const Tally& tally, const std::string& what) {
  EXPECT_GT(tally.accepted, 0) << what << ": every one of " << tally.total << " mutations refused";
  EXPECT_LT(tally.accepted, tally.total) << what << ": all " << tally.total << " mutations accepted";
}

size_t HeaderEnd(const std::string& safetensors) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(safetensors[i]);
  return 8 + n;
}

TEST(RandomMutationTest, SafetensorsHeaders) {
  const std::string seed = ReadFileOrDie(ModelDir("tiny-llama2") + "/model.safetensors");
  std::mt19937_64 rng(1);
  Tally tally;
  for (int i = 0; i < 20000; ++i) {
    std::string mutated = Mutate(seed, HeaderEnd(seed), rng);
    tally.Count(SafetensorsFile(Bytes(mutated), mutated.size()));
  }
  ExpectSomeAcceptedAndSomeRefused(tally, "safetensors headers");
}

TEST(RandomMutationTest, ModelConfigs) {
  std::mt19937_64 rng(2);
  for (const char* model : {"tiny-llama2", "tiny-llama3", "lamina-demo-6m"}) {
    const std::string seed = ReadFileOrDie(ModelDir(model) + "/config.json");
    Tally tally;
    for (int i = 0; i < 10000; ++i) {
      std::string mutated = Mutate(seed, seed.size(), rng);
      tally.Count(ModelConfigJson(Bytes(mutated), mutated.size()));
    }
    ExpectSomeAcceptedAndSomeRefused(tally, std::string(model) + "/config.json");
  }
}

TEST(RandomMutationTest, TokenizerFiles) {
  std::mt19937_64 rng(3);
  for (const char* model : {"tiny-llama2", "tiny-llama3"}) {
    const std::string seed = ReadFileOrDie(ModelDir(model) + "/tokenizer.json");
    // The interesting structure (pre-tokenizer, decoder, added tokens) is in the first few KB.
    Tally tally;
    for (int i = 0; i < 2000; ++i) {
      std::string mutated = Mutate(seed, 6000, rng);
      tally.Count(TokenizerJson(Bytes(mutated), mutated.size()));
    }
    ExpectSomeAcceptedAndSomeRefused(tally, std::string(model) + "/tokenizer.json");
  }
}

TEST(RandomMutationTest, ChatTemplates) {
  std::mt19937_64 rng(6);
  const nlohmann::json cases =
      nlohmann::json::parse(ReadFileOrDie(std::string(LAMINA_SOURCE_DIR) + "/tests/data/chat_templates/cases.json"));
  int seeds = 0;
  Tally tally;
  for (const auto& c : cases["cases"]) {
    const std::string seed = c["template"].get<std::string>();
    for (int i = 0; i < 400; ++i) {
      std::string mutated = Mutate(seed, seed.size(), rng, kJinjaCharacters);
      tally.Count(ChatTemplateSource(Bytes(mutated), mutated.size()));
    }
    ++seeds;
  }
  EXPECT_GE(seeds, 40);
  ExpectSomeAcceptedAndSomeRefused(tally, "chat templates");
}

TEST(RandomMutationTest, HttpRequestHeads) {
  std::mt19937_64 rng(7);
  const std::string kHttpCharacters = " :\r\n/?=&%-.0123456789HTTPGETPOST\t\x01\xff";
  const std::vector<std::string> seeds = {
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:50150\r\nContent-Type: application/json\r\n"
      "Content-Length: 187\r\nExpect: 100-continue",
      "GET /v1/models?x=1 HTTP/1.0\r\nConnection: keep-alive\r\nAccept: */*",
      "\r\nPOST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nContent-Length: 5",
  };
  Tally tally;
  for (const std::string& seed : seeds) {
    for (int i = 0; i < 3000; ++i) {
      std::string mutated = Mutate(seed, seed.size(), rng, kHttpCharacters);
      tally.Count(HttpRequestHead(Bytes(mutated), mutated.size()));
    }
  }
  ExpectSomeAcceptedAndSomeRefused(tally, "HTTP request heads");
}

TEST(RandomMutationTest, OpenAiBodies) {
  std::mt19937_64 rng(8);
  const std::vector<std::string> seeds = {
      R"({"model": "m", "prompt": ["a", [1, 2]], "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "n": 2,)"
      R"( "stop": ["\n"], "seed": 3, "logprobs": 2, "stream": true, "stream_options": {"include_usage": true}})",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text",)"
      R"( "text": "Hi"}]}], "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2, "top_k": -1,)"
      R"( "stop_token_ids": [5], "ignore_eos": false, "presence_penalty": -1.5})",
  };
  Tally tally;
  for (const std::string& seed : seeds) {
    for (int i = 0; i < 5000; ++i) {
      std::string mutated = Mutate(seed, seed.size(), rng);
      tally.Count(OpenAiBody(Bytes(mutated), mutated.size()));
    }
  }
  ExpectSomeAcceptedAndSomeRefused(tally, "OpenAI bodies");
  // Depth and size: a prompt nested deeper and deeper (up to 100,000 levels, which once crashed
  // the coordinator) and prompts and stops of every size up to megabytes.
  for (int depth : {1, 10, 31, 32, 33, 1000, 100000}) {
    const std::string body = R"({"prompt": )" + std::string(depth, '[') + "1" + std::string(depth, ']') + "}";
    OpenAiBody(Bytes(body), body.size());
  }
  for (size_t bytes : {size_t{1}, size_t{1} << 10, size_t{1} << 16, size_t{1} << 20, size_t{8} << 20}) {
    const std::string big(bytes, 'a');
    for (const std::string& body : {R"({"prompt": ")" + big + R"("})", R"({"prompt": "x", "stop": [")" + big + R"("]})"}) {
      OpenAiBody(Bytes(body), body.size());
    }
  }
}

TEST(RandomMutationTest, GenerateRequests) {
  std::mt19937_64 rng(9);
  std::vector<std::string> seeds;
  lamina::v1::GenerateRequest text;
  text.set_text("In this paper, we");
  text.set_max_tokens(5);
  text.set_n(2);
  text.add_stop_strings("\n");
  text.add_stop_token_ids(2);
  seeds.push_back(text.SerializeAsString());
  lamina::v1::GenerateRequest ids;
  for (int i = 0; i < 40; ++i) ids.mutable_token_ids()->add_ids(i * 7);
  ids.mutable_sampling()->set_temperature(0.7f);
  seeds.push_back(ids.SerializeAsString());
  lamina::v1::GenerateRequest chat;
  auto* message = chat.mutable_chat()->add_messages();
  message->set_role("user");
  message->set_content("Hi");
  seeds.push_back(chat.SerializeAsString());
  // And the attacks the bounds exist for: negative n and ids, a million stops, 200 MB of text.
  lamina::v1::GenerateRequest hostile = text;
  hostile.set_n(-1);
  hostile.add_stop_token_ids(-5);
  for (int i = 0; i < 100000; ++i) hostile.add_stop_strings("x");
  const std::string hostile_bytes = hostile.SerializeAsString();
  GenerateRequestProto(Bytes(hostile_bytes), hostile_bytes.size());
  lamina::v1::GenerateRequest huge;
  huge.set_text(std::string(200 << 20, 'a'));
  const std::string huge_bytes = huge.SerializeAsString();
  GenerateRequestProto(Bytes(huge_bytes), huge_bytes.size());
  EXPECT_FALSE(GenerateRequestProto(Bytes(hostile_bytes), hostile_bytes.size()));
  EXPECT_FALSE(GenerateRequestProto(Bytes(huge_bytes), huge_bytes.size()));
  Tally tally;
  int seeds_accepted = 0;
  for (const std::string& seed : seeds) {
    seeds_accepted += GenerateRequestProto(Bytes(seed), seed.size()) ? 1 : 0;
    for (int i = 0; i < 3000; ++i) {
      std::string mutated = Mutate(seed, seed.size(), rng);
      tally.Count(GenerateRequestProto(Bytes(mutated), mutated.size()));
    }
  }
  EXPECT_EQ(seeds_accepted, 2) << "the text and ids seeds convert; the chat one needs a template, which this model lacks";
  ExpectSomeAcceptedAndSomeRefused(tally, "GenerateRequests");
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

// Records for DataPlaneMessages: well-formed requests with random, often wrong, fields.
std::string DataPlaneRecord(std::mt19937_64& rng) {
  auto pick = [&rng](std::initializer_list<int64_t> values) { return values.begin()[rng() % values.size()]; };
  const float floats[] = {0.0f, 1.0f, -2.5f, 1e30f, -1e-30f, std::nanf(""), INFINITY};
  std::vector<uint8_t> payload;
  WireWriter w(&payload);
  auto put_floats = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) w.Put<float>(floats[rng() % (sizeof(floats) / sizeof(floats[0]))]);
  };
  auto seq = [&] { return pick({0, 1, 2, 3, -1, int64_t{1} << 40}); };
  const uint8_t type = static_cast<uint8_t>(rng() % 10);
  const int64_t n = pick({0, 1, 2, 3, 0x7fffffff});
  const int64_t shown = std::min<int64_t>(n, 4);  // entries actually written
  switch (type) {
    case 1:  // kReserve
    case 4:  // kFree
      w.Put<uint32_t>(static_cast<uint32_t>(n));
      for (int64_t i = 0; i < shown; ++i) {
        w.Put<int64_t>(seq());
        if (type == 1) w.Put<int32_t>(static_cast<int32_t>(pick({-1, 0, 1, 5, 15, 16, 40})));
      }
      break;
    case 2: {  // kStoreKv: k and v for `count` tokens, sometimes short
      const int64_t count = pick({-1, 0, 1, 3, int64_t{1} << 30});
      w.Put<int64_t>(pick({-1, 0, 1, 2}));
      w.Put<int64_t>(seq());
      w.Put<int32_t>(static_cast<int32_t>(pick({-1, 0, 1, 14, 20})));
      w.Put<int64_t>(count);
      put_floats(std::min<int64_t>(std::max<int64_t>(count, 0), 4) * 8 - static_cast<int64_t>(rng() % 2));
      break;
    }
    case 3:  // kDecode
      w.Put<int64_t>(pick({-1, 0, 1, 2}));
      w.Put<uint32_t>(static_cast<uint32_t>(n));
      for (int64_t i = 0; i < shown; ++i) {
        w.Put<int64_t>(seq());
        w.Put<int32_t>(static_cast<int32_t>(pick({-1, 0, 1, 15, 16})));
      }
      put_floats(shown * 16 - static_cast<int64_t>(rng() % 2));
      break;
    case 5:  // kOpenLink
      w.PutString(rng() % 2 ? "cuda_ipc" : "tcp");
      w.Put<int64_t>(pick({-1, 0, 4, int64_t{1} << 40}));
      w.Put<int32_t>(static_cast<int32_t>(pick({0, 1, 65})));
      w.PutString("offer");
      break;
    case 6:  // kBeginDecode
    case 8:  // kBeginStore
      w.Put<uint64_t>(static_cast<uint64_t>(rng() % 3));
      if (type == 6) w.Put<uint32_t>(static_cast<uint32_t>(pick({0, 1, 2})));
      w.Put<uint32_t>(static_cast<uint32_t>(n));
      for (int64_t i = 0; i < shown; ++i) {
        w.Put<int64_t>(seq());
        w.Put<int32_t>(static_cast<int32_t>(pick({-1, 0, 3})));
        if (type == 8) {
          w.Put<int64_t>(pick({-1, 1, 1000}));
          w.Put<uint32_t>(static_cast<uint32_t>(pick({0, 1, 5})));  // the piece's transfer
        }
      }
      break;
    default:  // kEndDecode, and types the server does not know: a few random bytes
      for (uint64_t i = rng() % 6; i > 0; --i) w.Put<uint8_t>(static_cast<uint8_t>(rng()));
  }
  std::string record(1, static_cast<char>(type));
  record += static_cast<char>(payload.size() & 0xff);
  record += static_cast<char>((payload.size() >> 8) & 0xff);
  record.append(payload.begin(), payload.end());
  return record;
}

TEST(RandomMutationTest, DataPlaneMessages) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 1500; ++i) {
    std::string messages;
    for (uint64_t m = 1 + rng() % 8; m > 0; --m) messages += DataPlaneRecord(rng);
    if (rng() % 3 == 0) messages = Mutate(messages, messages.size(), rng);
    DataPlaneMessages(Bytes(messages), messages.size());
  }
}

}  // namespace
}  // namespace lamina::fuzz
