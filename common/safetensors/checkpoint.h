// A Hugging Face checkpoint folder: either one model.safetensors, or shards listed by
// model.safetensors.index.json ("weight_map": tensor name -> shard file).
// Thread-safe after Open(): all methods are const.
#ifndef LAMINA_COMMON_SAFETENSORS_CHECKPOINT_H_
#define LAMINA_COMMON_SAFETENSORS_CHECKPOINT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors/safetensors_file.h"
#include "common/tensor/tensor.h"

namespace lamina {

class Checkpoint {
 public:
  // Opens `dir`/model.safetensors.index.json if present, else `dir`/model.safetensors.
  static absl::StatusOr<Checkpoint> Open(const std::string& dir);

  bool Contains(const std::string& name) const;
  // NotFound names the checkpoint and the tensor.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  // A floating-point tensor of `expected_shape` (any of F32, F16, BF16), unconverted:
  // InvalidArgument names the file, the tensor and both shapes when they differ, or its dtype.
  absl::StatusOr<TensorView> GetWeight(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // Reads a tensor as float32, checking it as GetWeight does.
  absl::StatusOr<Tensor> ReadFloat32(const std::string& name,
                                     const std::vector<int64_t>& expected_shape) const;
  // Part of a tensor as float32, checked as GetWeight checks the whole, reading only that part:
  // rows [first, first + count) (of a 1-D tensor, elements), or columns [first, first + count) of
  // each row of a 2-D tensor. What a tensor-parallel rank holds of a weight. InvalidArgument when
  // the range is not inside the tensor.
  absl::StatusOr<Tensor> ReadFloat32Rows(const std::string& name, const std::vector<int64_t>& expected_shape,
                                         int64_t first, int64_t count) const;
  absl::StatusOr<Tensor> ReadFloat32Columns(const std::string& name, const std::vector<int64_t>& expected_shape,
                                            int64_t first, int64_t count) const;
  // The file that holds `name` (for error messages).
  std::string FileOf(const std::string& name) const;

 private:
  Checkpoint(std::string dir, std::vector<std::unique_ptr<SafetensorsFile>> files,
             std::map<std::string, const SafetensorsFile*> index)
      : dir_(std::move(dir)), files_(std::move(files)), index_(std::move(index)) {}

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> index_;  // tensor name -> file holding it
};

}  // namespace lamina

#endif  // LAMINA_COMMON_SAFETENSORS_CHECKPOINT_H_
