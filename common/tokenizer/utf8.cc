#include "common/tokenizer/utf8.h"

namespace lamina::utf8 {
namespace {

// Length of the character a lead byte starts, or 0 for a byte that cannot lead.
int LeadLength(unsigned char byte) {
  if (byte < 0x80) return 1;
  if (byte >= 0xc2 && byte <= 0xdf) return 2;
  if (byte >= 0xe0 && byte <= 0xef) return 3;
  if (byte >= 0xf0 && byte <= 0xf4) return 4;
  return 0;
}

// Whether bytes[1..n) may follow bytes[0] in a well-formed character (checks the narrowed
// second-byte ranges that exclude overlong forms and surrogates).
bool ValidContinuation(std::string_view s, size_t pos, int n, int available) {
  unsigned char lead = s[pos];
  for (int i = 1; i < available; ++i) {
    unsigned char c = s[pos + i];
    if ((c & 0xc0) != 0x80) return false;
    if (i == 1) {
      if (lead == 0xe0 && c < 0xa0) return false;
      if (lead == 0xed && c > 0x9f) return false;
      if (lead == 0xf0 && c < 0x90) return false;
      if (lead == 0xf4 && c > 0x8f) return false;
    }
  }
  return true;
}

}  // namespace

void Append(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::vector<std::string_view> SplitChars(std::string_view text) {
  std::vector<std::string_view> chars;
  size_t pos = 0;
  while (pos < text.size()) {
    int n = LeadLength(static_cast<unsigned char>(text[pos]));
    if (n == 0 || pos + n > text.size() || !ValidContinuation(text, pos, n, n)) n = 1;
    chars.push_back(text.substr(pos, n));
    pos += n;
  }
  return chars;
}

size_t CompletePrefixLength(std::string_view bytes) {
  // Only the last three bytes can belong to an unfinished character.
  size_t start = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t pos = bytes.size(); pos-- > start;) {
    int n = LeadLength(static_cast<unsigned char>(bytes[pos]));
    if (n == 0) continue;  // A continuation byte (or an invalid one): look further back.
    int available = static_cast<int>(bytes.size() - pos);
    if (n > available && ValidContinuation(bytes, pos, n, available)) return pos;
    break;
  }
  return bytes.size();
}

std::string Sanitize(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    int n = LeadLength(static_cast<unsigned char>(bytes[pos]));
    if (n > 0 && pos + n <= bytes.size() && ValidContinuation(bytes, pos, n, n)) {
      out.append(bytes.substr(pos, n));
      pos += n;
      continue;
    }
    // Skip the maximal prefix of a valid sequence, then emit one replacement character.
    size_t skip = 1;
    if (n > 1) {
      while (skip < static_cast<size_t>(n) && pos + skip < bytes.size() &&
             ValidContinuation(bytes, pos, n, static_cast<int>(skip) + 1)) {
        ++skip;
      }
    }
    out.append("\xef\xbf\xbd");
    pos += skip;
  }
  return out;
}

}  // namespace lamina::utf8
