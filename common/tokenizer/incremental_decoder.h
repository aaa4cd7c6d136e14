// Turns a stream of generated token ids into text pieces that never split a UTF-8 character.
// Thread-compatible: one decoder per sequence.
#ifndef LAMINA_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_
#define LAMINA_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_

#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace lamina {

class IncrementalDecoder {
 public:
  // `at_text_start`: the first token begins the text (no prompt before it), so the decoder's added
  // prefix space is stripped, as a whole-text Decode() would.
  IncrementalDecoder(const Tokenizer* tokenizer, bool at_text_start)
      : tokenizer_(tokenizer), strip_pending_(at_text_start ? tokenizer->strip_leading_spaces() : 0) {}

  // Returns the newly completed text (possibly empty). Control tokens add nothing.
  std::string Add(int32_t id);
  // Returns what is left, with an unfinished character replaced by U+FFFD.
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes not yet returned: the start of an unfinished character
  int strip_pending_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_
