#include "deploy/cli/ordered_printer.h"

namespace lamina::cli {

void OrderedPrinter::Emit(const std::string& text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), out_);
  std::fflush(out_);
}

void OrderedPrinter::Write(size_t request, const std::string& text) {
  if (request == current_) {
    Emit(text);
  } else {
    pending_[request] += text;
  }
}

void OrderedPrinter::Finish(size_t request) {
  finished_[request] = true;
  pending_[request] += "\n";
  if (request != current_) return;
  Emit(pending_[current_]);
  // Move on past every request that has already finished, flushing each.
  while (current_ < finished_.size() && finished_[current_]) {
    ++current_;
    if (current_ < finished_.size()) {
      Emit(pending_[current_]);
      pending_[current_].clear();
    }
  }
}

}  // namespace lamina::cli
