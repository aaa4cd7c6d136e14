// Reader for one .safetensors file (https://github.com/huggingface/safetensors), memory-mapped.
//
// Open() validates the whole header before returning: an 8-byte little-endian header length that
// fits in the file, a JSON object whose entries each have a supported dtype, a shape of
// non-negative integers, and data_offsets [begin, end] inside the data section whose length equals
// shape x dtype size; no two tensors may overlap. Every error names the file and the tensor.
// Thread-safe after Open(): all methods are const.
#ifndef LAMINA_COMMON_SAFETENSORS_SAFETENSORS_FILE_H_
#define LAMINA_COMMON_SAFETENSORS_SAFETENSORS_FILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors/mapped_file.h"
#include "common/tensor/dtype.h"

namespace lamina {

// A view of one tensor's bytes inside a mapped file; valid while the file is open.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data;  // [NumElements(shape) * DTypeSize(dtype)] bytes, any alignment
  size_t num_bytes;

  int64_t NumElements() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Parses a file already in memory (used by the fuzzer and tests); `label` names it in errors.
  // The bytes must outlive the returned object.
  static absl::StatusOr<std::map<std::string, TensorView>> ParseBuffer(const uint8_t* data,
                                                                       size_t size,
                                                                       const std::string& label);

  const std::string& path() const { return file_.path(); }
  bool Contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // NotFound names the file and the tensor.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  std::vector<std::string> TensorNames() const;

 private:
  SafetensorsFile(MappedFile file, std::map<std::string, TensorView> tensors)
      : file_(std::move(file)), tensors_(std::move(tensors)) {}

  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_SAFETENSORS_SAFETENSORS_FILE_H_
