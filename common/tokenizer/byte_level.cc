#include "common/tokenizer/byte_level.h"

#include <array>
#include <cstdint>
#include <unordered_map>

#include "common/tokenizer/utf8.h"

namespace lamina::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_char;
  std::unordered_map<uint32_t, uint8_t> char_to_byte;
};

// Printable Latin-1 bytes map to themselves; the rest map to U+0100 upwards, in byte order.
const Tables& GetTables() {
  static const Tables* tables = [] {
    auto* t = new Tables;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      uint32_t cp = printable ? b : next++;
      utf8::Append(cp, &t->byte_to_char[b]);
      t->char_to_byte[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return *tables;
}

uint32_t DecodeCodePoint(std::string_view c) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(c[i])); };
  switch (c.size()) {
    case 1:
      return b(0);
    case 2:
      return (b(0) & 0x1f) << 6 | (b(1) & 0x3f);
    case 3:
      return (b(0) & 0x0f) << 12 | (b(1) & 0x3f) << 6 | (b(2) & 0x3f);
    default:
      return (b(0) & 0x07) << 18 | (b(1) & 0x3f) << 12 | (b(2) & 0x3f) << 6 | (b(3) & 0x3f);
  }
}

}  // namespace

std::string Encode(std::string_view bytes) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.byte_to_char[b];
  return out;
}

std::string Decode(std::string_view text) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(text.size());
  for (std::string_view c : utf8::SplitChars(text)) {
    auto it = t.char_to_byte.find(DecodeCodePoint(c));
    if (it != t.char_to_byte.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(c);
    }
  }
  return out;
}

}  // namespace lamina::byte_level
