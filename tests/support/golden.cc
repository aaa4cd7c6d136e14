#include "tests/support/golden.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace lamina::testing {

std::string ModelDir(const std::string& model) {
  if (model == "lamina-demo-6m") return std::string(LAMINA_SOURCE_DIR) + "/deploy/models/" + model;
  return std::string(LAMINA_SOURCE_DIR) + "/tests/data/" + model;
}

std::string GoldenDir(const std::string& model) {
  return std::string(LAMINA_SOURCE_DIR) + "/tests/data/" + model;
}

nlohmann::json LoadGoldenJson(const std::string& model) {
  std::ifstream in(GoldenDir(model) + "/golden.json");
  if (!in) throw std::runtime_error("missing golden.json for " + model);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

GoldenTensors::GoldenTensors(const std::string& model)
    : path_(GoldenDir(model) + "/golden.safetensors") {}

Tensor GoldenTensors::Float(const std::string& name) const {
  auto file = SafetensorsFile::Open(path_);
  if (!file.ok()) throw std::runtime_error(std::string(file.status().message()));
  auto view = file->Get(name);
  if (!view.ok()) throw std::runtime_error(std::string(view.status().message()));
  Tensor tensor(view->shape);
  ConvertToFloat32(view->dtype, view->data, view->NumElements(), tensor.data());
  return tensor;
}

std::vector<int32_t> GoldenTensors::Ids(const std::string& name) const {
  Tensor values = Float(name);
  std::vector<int32_t> ids(values.size());
  for (int64_t i = 0; i < values.size(); ++i) ids[i] = static_cast<int32_t>(values.data()[i]);
  return ids;
}

double RelativeError(const float* a, const float* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::sqrt(ref > 0 ? ref : 1.0);
}

}  // namespace lamina::testing
