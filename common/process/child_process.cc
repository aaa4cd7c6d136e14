#include "common/process/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lamina {

absl::StatusOr<pid_t> SpawnLogged(const std::vector<std::string>& argv, const std::string& log_file) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  const int log = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot write ", log_file, ": ", std::strerror(errno)));
  // Built before fork: the child only calls async-signal-safe functions.
  std::vector<std::string> args = argv;
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the parent died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::execv(c_args[0], c_args.data());
    const char* reason = std::strerror(errno);
    (void)!::write(STDERR_FILENO, "cannot run ", 11);
    (void)!::write(STDERR_FILENO, c_args[0], std::strlen(c_args[0]));
    (void)!::write(STDERR_FILENO, ": ", 2);
    (void)!::write(STDERR_FILENO, reason, std::strlen(reason));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  ::close(log);
  return pid;
}

std::string TailOfFile(const std::string& path, size_t lines, const std::string& separator) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t from = all.size() > lines ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + static_cast<std::ptrdiff_t>(from), all.end(), separator);
}

}  // namespace lamina
