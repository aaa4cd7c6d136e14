// UTF-8 helpers for the tokenizer and streaming output. Pure functions; thread-safe.
#ifndef LAMINA_COMMON_TOKENIZER_UTF8_H_
#define LAMINA_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lamina::utf8 {

// Appends the UTF-8 encoding of `code_point` to `out`.
void Append(uint32_t code_point, std::string* out);

// Splits valid or invalid UTF-8 into characters; an invalid byte becomes a one-byte piece.
std::vector<std::string_view> SplitChars(std::string_view text);

// Length of the longest prefix of `bytes` that does not end inside an unfinished multi-byte
// character (one that more bytes could still complete).
size_t CompletePrefixLength(std::string_view bytes);

// Replaces each invalid sequence with U+FFFD, as Rust's String::from_utf8_lossy does.
std::string Sanitize(std::string_view bytes);

}  // namespace lamina::utf8

#endif  // LAMINA_COMMON_TOKENIZER_UTF8_H_
