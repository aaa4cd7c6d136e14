// How much memory this machine can still give a process: what is checked before a large
// allocation, so that an impossible one is refused with the sizes rather than ending in the
// kernel's OOM killer. Thread-safe.
#ifndef LAMINA_COMMON_PROCESS_HOST_MEMORY_H_
#define LAMINA_COMMON_PROCESS_HOST_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lamina {

// MemAvailable of /proc/meminfo, in bytes; -1 where it cannot be read.
int64_t AvailableHostMemory();

// ResourceExhausted, naming `what` and both sizes, when `bytes` exceed AvailableHostMemory (an
// unreadable figure passes).
absl::Status CheckHostMemoryFor(absl::string_view what, int64_t bytes);

}  // namespace lamina

#endif  // LAMINA_COMMON_PROCESS_HOST_MEMORY_H_
