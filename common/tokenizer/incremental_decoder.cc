#include "common/tokenizer/incremental_decoder.h"

#include "common/tokenizer/utf8.h"

namespace lamina {

std::string IncrementalDecoder::Add(int32_t id) {
  const std::string& bytes = tokenizer_->TokenBytes(id);
  if (bytes.empty()) return "";
  size_t begin = 0;
  while (strip_pending_ > 0 && begin < bytes.size() && bytes[begin] == ' ') {
    ++begin;
    --strip_pending_;
  }
  strip_pending_ = 0;  // Only the text's very first characters are stripped.
  pending_.append(bytes, begin, std::string::npos);
  size_t complete = utf8::CompletePrefixLength(pending_);
  std::string out = utf8::Sanitize(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string IncrementalDecoder::Finish() {
  std::string out = utf8::Sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace lamina
