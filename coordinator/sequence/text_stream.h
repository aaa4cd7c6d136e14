// A request's text as tokens arrive: never splits a UTF-8 character, and holds back text that
// could be the start of a stop string until it is known not to be one. When a stop string
// appears, the text before it is the last to be shown.
// Thread-compatible: one per request.
#ifndef LAMINA_COORDINATOR_SEQUENCE_TEXT_STREAM_H_
#define LAMINA_COORDINATOR_SEQUENCE_TEXT_STREAM_H_

#include <string>
#include <vector>

#include "common/tokenizer/incremental_decoder.h"

namespace lamina {

class TextStream {
 public:
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop_strings)
      : decoder_(tokenizer, /*at_text_start=*/false), stop_strings_(std::move(stop_strings)) {}

  // The text that can be shown after `token`; sets *stopped when a stop string appeared. Without
  // `stops_count` (before a request's min_tokens) a whole stop string does not stop it, though
  // the start of one is still held back.
  std::string Add(int32_t token, bool* stopped, bool stops_count = true);
  // The text still held back (call once, when the sequence ends without a stop string).
  std::string Finish();

 private:
  // Moves out of held_ what can be shown; with `final`, everything.
  std::string Release(bool final, bool* stopped, bool stops_count = true);

  IncrementalDecoder decoder_;
  std::vector<std::string> stop_strings_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SEQUENCE_TEXT_STREAM_H_
