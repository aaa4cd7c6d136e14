#include "coordinator/sequence/text_stream.h"

#include <algorithm>

namespace lamina {

std::string TextStream::Release(bool final, bool* stopped, bool stops_count) {
  // A whole stop string: show what precedes the earliest one and stop.
  size_t earliest = std::string::npos;
  for (const std::string& stop : stop_strings_) {
    if (stops_count && !stop.empty()) earliest = std::min(earliest, held_.find(stop));
  }
  if (earliest != std::string::npos) {
    std::string out = held_.substr(0, earliest);
    held_.clear();
    stopped_ = true;
    if (stopped) *stopped = true;
    return out;
  }
  if (final) return std::move(held_);
  // Keep the longest tail that is a prefix of some stop string.
  size_t keep = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextStream::Add(int32_t token, bool* stopped, bool stops_count) {
  if (stopped_) return "";
  held_ += decoder_.Add(token);
  return Release(false, stopped, stops_count);
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  held_ += decoder_.Finish();
  return Release(true, nullptr);
}

}  // namespace lamina
