// A read-only memory mapping of a whole file. Move-only RAII owner.
// Thread-safe for concurrent reads.
#ifndef LAMINA_COMMON_SAFETENSORS_MAPPED_FILE_H_
#define LAMINA_COMMON_SAFETENSORS_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace lamina {

class MappedFile {
 public:
  // NotFound when the file is missing; InvalidArgument when it is not a regular file.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void Release();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_SAFETENSORS_MAPPED_FILE_H_
