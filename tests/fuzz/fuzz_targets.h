// Entry points shared by the libFuzzer programs (built with -DLAMINA_BUILD_FUZZERS=ON and clang)
// and the randomized mutation test that runs in every CI build. Each parses untrusted bytes and
// must return an error Status for bad input, never crash, hang or read out of bounds. Those that
// return bool say whether the input was accepted, so that the mutation test can tell a parser that
// refuses everything from one that works.
#ifndef LAMINA_TESTS_FUZZ_FUZZ_TARGETS_H_
#define LAMINA_TESTS_FUZZ_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>

namespace lamina::fuzz {

// A whole .safetensors file.
bool SafetensorsFile(const uint8_t* data, size_t size);
// A config.json.
bool ModelConfigJson(const uint8_t* data, size_t size);
// A tokenizer.json; when it loads, a few strings are encoded and decoded with it.
bool TokenizerJson(const uint8_t* data, size_t size);
// Text for the tiny-llama3 (byte-level) and tiny-llama2 (byte-fallback) tokenizers: valid UTF-8
// must survive encode + decode unchanged; any bytes must decode to valid UTF-8.
void TokenizerText(const uint8_t* data, size_t size);

// A chat template's source: it must parse or fail with InvalidArgument, and when it parses, render
// a short conversation or fail with InvalidArgument, in bounded time and memory.
bool ChatTemplateSource(const uint8_t* data, size_t size);

// A request head as the HTTP server reads it (before the empty line): it must parse or fail with
// InvalidArgument or Unimplemented, and a parsed head's body length must stay within the limit.
bool HttpRequestHead(const uint8_t* data, size_t size);
// A POST body for OpenAI's /v1/completions and /v1/chat/completions: each must parse into
// requests the scheduler can take, or fail with InvalidArgument.
bool OpenAiBody(const uint8_t* data, size_t size);

// A gRPC GenerateRequest as the coordinator receives it (protobuf bytes): when it parses, its
// conversion for the demo model must succeed within the request bounds (n, stops, ids) or fail with
// InvalidArgument (FailedPrecondition only for a chat when the model has no template), never crash.
bool GenerateRequestProto(const uint8_t* data, size_t size);

// A compute node's data-plane requests to a memory node (an AttentionServer on a CPU pool, over
// the in-process transport), as [u8 type (mod 10), u16 length, payload] records: each must get a
// reply naming its status, and afterwards the same connection must still reserve, decode and
// answer correctly.
void DataPlaneMessages(const uint8_t* data, size_t size);

}  // namespace lamina::fuzz

#endif  // LAMINA_TESTS_FUZZ_FUZZ_TARGETS_H_
