// A temporary folder removed with its contents when the object dies, for tests that write files.
#ifndef LAMINA_TESTS_SUPPORT_TEMP_DIR_H_
#define LAMINA_TESTS_SUPPORT_TEMP_DIR_H_

#include <string>

namespace lamina::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Writes `contents` to path()/name and returns the full path.
  std::string Write(const std::string& name, const std::string& contents) const;
  // Copies every regular file of `dir` into this folder.
  void CopyFrom(const std::string& dir) const;

 private:
  std::string path_;
};

std::string ReadFileOrDie(const std::string& path);
// The file's bytes, or "" when it cannot be read (a log not yet written).
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_SUPPORT_TEMP_DIR_H_
