#include "common/process/host_memory.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace lamina {

int64_t AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

absl::Status CheckHostMemoryFor(absl::string_view what, int64_t bytes) {
  const int64_t available = AvailableHostMemory();
  if (available < 0 || bytes <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", bytes / (1 << 20), " MiB; this machine has ",
                                                   available / (1 << 20), " MiB available"));
}

}  // namespace lamina
