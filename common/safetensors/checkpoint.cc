#include "common/safetensors/checkpoint.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace lamina {
namespace {

bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return json;
}

}  // namespace

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> index;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (FileExists(index_path)) {
    LAMINA_ASSIGN_OR_RETURN(nlohmann::json json, ReadJsonFile(index_path));
    auto map_it = json.find("weight_map");
    if (!json.is_object() || map_it == json.end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": no object 'weight_map'"));
    }
    std::map<std::string, const SafetensorsFile*> by_shard;
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      if (!it->is_string() || it->get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": weight_map entry for '", it.key(), "' is not a file name"));
      }
      const std::string shard = it->get<std::string>();
      if (by_shard.count(shard) == 0) {
        LAMINA_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(absl::StrCat(dir, "/", shard)));
        files.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
        by_shard[shard] = files.back().get();
      }
      const SafetensorsFile* file = by_shard[shard];
      if (!file->Contains(it.key())) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", it.key(),
                                                       "' is mapped to ", shard,
                                                       ", which does not hold it"));
      }
      index[it.key()] = file;
    }
  } else {
    LAMINA_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(dir + "/model.safetensors"));
    files.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
    for (const std::string& name : files.back()->TensorNames()) index[name] = files.back().get();
  }
  return Checkpoint(dir, std::move(files), std::move(index));
}

bool Checkpoint::Contains(const std::string& name) const { return index_.count(name) != 0; }

std::string Checkpoint::FileOf(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? dir_ : it->second->path();
}

absl::StatusOr<TensorView> Checkpoint::Get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": checkpoint has no tensor '", name, "'"));
  }
  return it->second->Get(name);
}

absl::StatusOr<TensorView> Checkpoint::GetWeight(const std::string& name,
                                                const std::vector<int64_t>& expected_shape) const {
  LAMINA_ASSIGN_OR_RETURN(TensorView view, Get(name));
  if (view.shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        FileOf(name), ": tensor '", name, "' has shape [", absl::StrJoin(view.shape, ", "),
        "], expected [", absl::StrJoin(expected_shape, ", "), "] from config.json"));
  }
  if (view.dtype == DType::kI64 || view.dtype == DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat(FileOf(name), ": tensor '", name,
                                                   "' has integer dtype ", DTypeName(view.dtype),
                                                   "; weights must be F32, F16 or BF16"));
  }
  return view;
}

absl::StatusOr<Tensor> Checkpoint::ReadFloat32(const std::string& name,
                                               const std::vector<int64_t>& expected_shape) const {
  LAMINA_ASSIGN_OR_RETURN(TensorView view, GetWeight(name, expected_shape));
  Tensor tensor(expected_shape);
  ConvertToFloat32(view.dtype, view.data, static_cast<size_t>(view.NumElements()), tensor.data());
  return tensor;
}

namespace {

absl::Status CheckRange(const std::string& name, int64_t first, int64_t count, int64_t size, const char* what) {
  if (first < 0 || count < 1 || first + count > size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", what, " [", first, ", ", first + count,
                                                   ") are not inside its ", size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> Checkpoint::ReadFloat32Rows(const std::string& name, const std::vector<int64_t>& expected_shape,
                                                   int64_t first, int64_t count) const {
  LAMINA_ASSIGN_OR_RETURN(TensorView view, GetWeight(name, expected_shape));
  if (expected_shape.empty()) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has no rows"));
  LAMINA_RETURN_IF_ERROR(CheckRange(name, first, count, expected_shape[0], "rows"));
  std::vector<int64_t> shape = expected_shape;
  shape[0] = count;
  Tensor tensor(shape);
  const int64_t row = tensor.size() / count;  // elements a row
  const size_t bytes = DTypeSize(view.dtype);
  ConvertToFloat32(view.dtype, view.data + first * row * bytes, static_cast<size_t>(tensor.size()), tensor.data());
  return tensor;
}

absl::StatusOr<Tensor> Checkpoint::ReadFloat32Columns(const std::string& name,
                                                      const std::vector<int64_t>& expected_shape, int64_t first,
                                                      int64_t count) const {
  LAMINA_ASSIGN_OR_RETURN(TensorView view, GetWeight(name, expected_shape));
  if (expected_shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': columns of a tensor that is not 2-D"));
  }
  const int64_t rows = expected_shape[0], cols = expected_shape[1];
  LAMINA_RETURN_IF_ERROR(CheckRange(name, first, count, cols, "columns"));
  Tensor tensor({rows, count});
  const size_t bytes = DTypeSize(view.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    ConvertToFloat32(view.dtype, view.data + (r * cols + first) * bytes, static_cast<size_t>(count), tensor.row(r));
  }
  return tensor;
}

}  // namespace lamina
