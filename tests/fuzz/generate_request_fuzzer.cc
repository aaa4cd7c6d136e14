// libFuzzer entry point; see fuzz_targets.h.
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lamina::fuzz::GenerateRequestProto(data, size);
  return 0;
}
