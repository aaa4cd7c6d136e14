#include "common/chat_template/py_string.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace lamina::jinja {

bool IsPySpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto strip = [&](char c) {
    return chars == nullptr || chars->is_none() ? IsPySpace(c) : chars->str().find(c) != std::string::npos;
  };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end && strip(s[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(s[end - 1])) --end;
  }
  return s.substr(begin, end - begin);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string Capitalize(const std::string& s) {
  std::string out = Lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool after_letter = false;
  for (char& c : out) {
    const bool letter = std::isalpha(static_cast<unsigned char>(c));
    if (letter) c = static_cast<char>(after_letter ? std::tolower(c) : std::toupper(c));
    after_letter = letter;
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    absl::StrAppend(&out, s.substr(pos, hit - pos), to);
    pos = hit + from.size();
  }
  return out + s.substr(pos);
}

ValueList Split(const std::string& s, const Value* sep, int64_t max_split) {
  ValueList out;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace, none at the ends
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsPySpace(s[i])) ++i;
      if (i >= s.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(out.size()) == max_split) {
        out.emplace_back(Strip(s.substr(i), nullptr, false, true));
        break;
      }
      size_t j = i;
      while (j < s.size() && !IsPySpace(s[j])) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->str();
  size_t pos = 0;
  while (max_split < 0 || static_cast<int64_t>(out.size()) < max_split) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

}  // namespace lamina::jinja
