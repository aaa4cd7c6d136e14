// Access to the reference models and golden outputs copied from ../shared/fixtures into
// tests/data (tiny models) and deploy/models (the demo model).
#ifndef LAMINA_TESTS_SUPPORT_GOLDEN_H_
#define LAMINA_TESTS_SUPPORT_GOLDEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors/safetensors_file.h"
#include "common/tensor/tensor.h"
#include "nlohmann/json.hpp"

namespace lamina::testing {

// Folder with config.json, model.safetensors and the tokenizer of `model`
// ("tiny-llama2", "tiny-llama3" or "lamina-demo-6m").
std::string ModelDir(const std::string& model);
// Folder with golden.json and golden.safetensors of `model`.
std::string GoldenDir(const std::string& model);

nlohmann::json LoadGoldenJson(const std::string& model);

// golden.safetensors of one model; tensors come out as float32 or int ids.
class GoldenTensors {
 public:
  explicit GoldenTensors(const std::string& model);
  Tensor Float(const std::string& name) const;
  std::vector<int32_t> Ids(const std::string& name) const;

 private:
  std::string path_;
};

// ||a - b|| / ||b|| over all elements.
double RelativeError(const float* a, const float* b, int64_t n);

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_SUPPORT_GOLDEN_H_
