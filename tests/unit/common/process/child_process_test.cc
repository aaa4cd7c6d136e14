#include "common/process/child_process.h"

#include <sys/wait.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

int WaitForExit(pid_t pid) {
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

TEST(ChildProcessTest, BothOutputStreamsGoToTheLogAndTheExitCodeComesBack) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/child.log";
  auto pid = SpawnLogged({"/bin/sh", "-c", "echo one; echo two >&2; echo three; exit 3"}, log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(WaitForExit(*pid), 3);
  EXPECT_EQ(TailOfFile(log, 10, "|"), "one|two|three");
  EXPECT_EQ(TailOfFile(log, 2, "\n"), "two\nthree");
}

TEST(ChildProcessTest, TheChildHasItsOwnProcessGroup) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/child.log";
  // The shell prints its process group (field 5 of /proc/PID/stat) and its pid: equal when it
  // leads its own group.
  auto pid = SpawnLogged({"/bin/sh", "-c", "cut -d' ' -f5 /proc/$$/stat; echo $$"}, log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(WaitForExit(*pid), 0);
  const std::string text = TailOfFile(log, 2, " ");
  EXPECT_EQ(text, std::to_string(*pid) + " " + std::to_string(*pid));
}

TEST(ChildProcessTest, AProgramThatCannotRunExits127AndTheLogSaysWhy) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/child.log";
  auto pid = SpawnLogged({"/no/such/program", "--flag"}, log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(WaitForExit(*pid), 127);
  EXPECT_EQ(TailOfFile(log, 1, ""), "cannot run /no/such/program: No such file or directory");
}

TEST(ChildProcessTest, AnUnwritableLogIsAnErrorNamingIt) {
  auto pid = SpawnLogged({"/bin/true"}, "/no/such/folder/child.log");
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("cannot write /no/such/folder/child.log"), std::string::npos) << pid.status();
  EXPECT_EQ(TailOfFile("/no/such/folder/child.log", 3, "\n"), "");
}

}  // namespace
}  // namespace lamina
