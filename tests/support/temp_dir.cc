#include "tests/support/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace lamina::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "lamina-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::Write(const std::string& name, const std::string& contents) const {
  const std::string full = path_ + "/" + name;
  std::ofstream out(full, std::ios::binary);
  out << contents;
  return full;
}

void TempDir::CopyFrom(const std::string& dir) const {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      std::filesystem::copy_file(entry.path(), std::filesystem::path(path_) / entry.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::permissions(std::filesystem::path(path_) / entry.path().filename(),
                                   std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
    }
  }
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace lamina::testing
