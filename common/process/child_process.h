// Starting Lamina's own programs as supervised child processes (`lamina up` starts the daemons;
// `lamina experiment` starts `lamina up`), and reading what they logged.
// Thread-compatible.
#ifndef LAMINA_COMMON_PROCESS_CHILD_PROCESS_H_
#define LAMINA_COMMON_PROCESS_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina {

// Runs argv[0] (a path; no PATH search) with `argv`, its stdout and stderr to `log_file`
// (truncated). The child gets its own process group, so terminal signals reach only the parent,
// which stops its children in order; it is sent SIGTERM if the parent dies (PR_SET_PDEATHSIG);
// its signal mask is cleared. If the program cannot be run the child writes why to the log and
// exits 127. Returns the child's pid; Internal when the log cannot be written or fork fails.
// Flushes this process's stdio buffers first, so that the child does not repeat them.
absl::StatusOr<pid_t> SpawnLogged(const std::vector<std::string>& argv, const std::string& log_file);

// The last `lines` lines of a text file joined by `separator`; "" when it cannot be read.
std::string TailOfFile(const std::string& path, size_t lines, const std::string& separator);

}  // namespace lamina

#endif  // LAMINA_COMMON_PROCESS_CHILD_PROCESS_H_
