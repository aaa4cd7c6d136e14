// GPT-2's reversible byte <-> printable-character mapping used by ByteLevel BPE tokenizers.
// Thread-safe: the tables are built once and never change.
#ifndef LAMINA_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define LAMINA_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <string>
#include <string_view>

namespace lamina::byte_level {

// Maps every byte of `bytes` to its printable character (UTF-8).
std::string Encode(std::string_view bytes);
// Maps printable characters back to bytes; a character outside the table is kept as is.
std::string Decode(std::string_view text);

}  // namespace lamina::byte_level

#endif  // LAMINA_COMMON_TOKENIZER_BYTE_LEVEL_H_
