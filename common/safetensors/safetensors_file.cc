#include "common/safetensors/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace lamina {
namespace {

// Real headers are a few hundred KiB; anything larger is a corrupted length field.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Invalid(const std::string& label, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(label, ": ", what));
}

absl::StatusOr<TensorView> ParseEntry(const std::string& label, const std::string& name,
                                      const nlohmann::json& entry, const uint8_t* data_section,
                                      uint64_t data_size) {
  std::string where = absl::StrCat("tensor '", name, "'");
  if (!entry.is_object()) return Invalid(label, where + " is not a JSON object");
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return Invalid(label, where + " has no string field 'dtype'");
  }
  auto dtype = ParseDType(dtype_it->get<std::string>());
  if (!dtype.ok()) return Invalid(label, where + ": " + std::string(dtype.status().message()));

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return Invalid(label, where + " has no array field 'shape'");
  }
  TensorView view;
  view.name = name;
  view.dtype = *dtype;
  uint64_t elements = 1;
  for (const auto& dim : *shape_it) {
    if (!dim.is_number_unsigned()) {
      return Invalid(label, where + " has a shape entry that is not a non-negative integer");
    }
    uint64_t d = dim.get<uint64_t>();
    if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / d / 8) {
      return Invalid(label, where + " has a shape whose size overflows");
    }
    elements *= d;
    view.shape.push_back(static_cast<int64_t>(d));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return Invalid(label, where + " needs 'data_offsets' as two non-negative integers");
  }
  uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) return Invalid(label, where + " has data_offsets with begin > end");
  if (end > data_size) {
    return Invalid(label, absl::StrCat(where, " has data_offsets [", begin, ", ", end,
                                       "] past the end of the file (data section is ", data_size,
                                       " bytes; the file may be truncated)"));
  }
  uint64_t expected = elements * DTypeSize(view.dtype);
  if (end - begin != expected) {
    return Invalid(label, absl::StrCat(where, " spans ", end - begin, " bytes but its shape and ",
                                       DTypeName(view.dtype), " need ", expected));
  }
  view.data = data_section + begin;
  view.num_bytes = static_cast<size_t>(expected);
  return view;
}

}  // namespace

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::map<std::string, TensorView>> SafetensorsFile::ParseBuffer(
    const uint8_t* data, size_t size, const std::string& label) {
  if (size < 8) return Invalid(label, "file is shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxHeaderBytes) {
    return Invalid(label, absl::StrCat("header length ", header_len, " is implausibly large"));
  }
  if (header_len > size - 8) {
    return Invalid(label, absl::StrCat("header length ", header_len, " runs past the end of the ",
                                       size, "-byte file (truncated?)"));
  }
  const char* header_begin = reinterpret_cast<const char*>(data + 8);
  nlohmann::json header = nlohmann::json::parse(header_begin, header_begin + header_len, nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded()) return Invalid(label, "header is not valid JSON");
  if (!header.is_object()) return Invalid(label, "header is not a JSON object");

  const uint8_t* data_section = data + 8 + header_len;
  uint64_t data_size = size - 8 - header_len;
  std::map<std::string, TensorView> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Invalid(label, "'__metadata__' is not a JSON object");
      continue;
    }
    LAMINA_ASSIGN_OR_RETURN(TensorView view,
                            ParseEntry(label, it.key(), it.value(), data_section, data_size));
    tensors.emplace(it.key(), std::move(view));
  }

  // No two tensors may share bytes.
  std::vector<const TensorView*> by_offset;
  for (const auto& [name, view] : tensors) by_offset.push_back(&view);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorView* prev = by_offset[i - 1];
    if (prev->data + prev->num_bytes > by_offset[i]->data) {
      return Invalid(label, absl::StrCat("tensors '", prev->name, "' and '", by_offset[i]->name,
                                         "' overlap"));
    }
  }
  return tensors;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  LAMINA_ASSIGN_OR_RETURN(auto tensors, ParseBuffer(file.data(), file.size(), path));
  return SafetensorsFile(std::move(file), std::move(tensors));
}

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path(), ": no tensor named '", name, "'"));
  }
  return it->second;
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

}  // namespace lamina
