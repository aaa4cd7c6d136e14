#include "common/safetensors/safetensors_file.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/safetensors/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

using ::lamina::testing::TempDir;

// Builds a safetensors file from a header JSON and a data section.
std::string MakeFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string Floats(std::initializer_list<float> values) {
  std::string bytes(values.size() * 4, '\0');
  size_t i = 0;
  for (float v : values) std::memcpy(&bytes[4 * i++], &v, 4);
  return bytes;
}

absl::Status ParseStatus(const std::string& file) {
  return SafetensorsFile::ParseBuffer(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "x.safetensors").status();
}

TEST(SafetensorsFileTest, ReadsTensorsAndMetadata) {
  TempDir dir;
  std::string path = dir.Write("model.safetensors",
                               MakeFile(R"({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                                        R"( "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]}})",
                                        Floats({1.5f, -2.0f}) + std::string("\x80\x3f\x00\x40", 4)));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto a = file->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2}));
  float values[2];
  ConvertToFloat32(a->dtype, a->data, 2, values);
  EXPECT_EQ(values[0], 1.5f);
  EXPECT_EQ(values[1], -2.0f);
  auto b = file->Get("b");
  ASSERT_TRUE(b.ok());
  ConvertToFloat32(b->dtype, b->data, 2, values);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 2.0f);
  EXPECT_EQ(file->Get("c").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, RejectsBrokenHeadersNamingTheProblem) {
  const std::string data = Floats({1, 2, 3, 4});
  struct Case {
    std::string file;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"abc", "shorter than the 8-byte"},
      {MakeFile("{", data), "not valid JSON"},
      {MakeFile("[1]", data), "not a JSON object"},
      {MakeFile(R"({"t": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", data), "unsupported dtype 'F64'"},
      {MakeFile(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", data), "non-negative integer"},
      {MakeFile(R"({"t": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", data), "past the end"},
      {MakeFile(R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", data), "need 12"},
      {MakeFile(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", data), "begin > end"},
      {MakeFile(R"({"t": {"dtype": "F32", "shape": [2]}})", data), "data_offsets"},
      {MakeFile(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", data),
       "overlap"},
  };
  for (const Case& c : cases) {
    absl::Status status = ParseStatus(c.file);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(status.message().find("x.safetensors"), std::string::npos) << status;
    EXPECT_NE(status.message().find(c.expected), std::string::npos) << status;
  }
  std::string truncated = MakeFile(R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", data);
  truncated.resize(truncated.size() - 3);
  EXPECT_NE(ParseStatus(truncated).message().find("truncated"), std::string::npos);
  std::string huge_length(8, '\xff');
  EXPECT_NE(ParseStatus(huge_length + "{}").message().find("implausibly large"), std::string::npos);
}

TEST(CheckpointTest, ReadsShardedCheckpointsThroughTheIndex) {
  TempDir dir;
  dir.Write("part-1.safetensors", MakeFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({3})));
  dir.Write("part-2.safetensors", MakeFile(R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", Floats({4, 5})));
  dir.Write("model.safetensors.index.json",
            R"({"metadata": {}, "weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto b = ckpt->ReadFloat32("b", {2});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data()[1], 5.0f);
  auto wrong = ckpt->ReadFloat32("a", {2});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("part-1.safetensors"), std::string::npos) << wrong.status();
  EXPECT_NE(wrong.status().message().find("tensor 'a' has shape [1], expected [2]"), std::string::npos);
}

// A tensor-parallel rank's slices: rows, or columns of each row, read alone and converted; a
// range outside the tensor is refused, naming it.
TEST(CheckpointTest, ReadsRowsAndColumnsOfATensor) {
  TempDir dir;
  dir.Write("model.safetensors", MakeFile(R"({"m": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})",
                                          Floats({1, 2, 3, 4, 5, 6})));
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto row = ckpt->ReadFloat32Rows("m", {2, 3}, 1, 1);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(std::vector<float>(row->data(), row->data() + 3), (std::vector<float>{4, 5, 6}));
  auto columns = ckpt->ReadFloat32Columns("m", {2, 3}, 1, 2);
  ASSERT_TRUE(columns.ok()) << columns.status();
  EXPECT_EQ(columns->shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::vector<float>(columns->data(), columns->data() + 4), (std::vector<float>{2, 3, 5, 6}));
  const absl::Status beyond = ckpt->ReadFloat32Columns("m", {2, 3}, 2, 2).status();
  EXPECT_EQ(beyond.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.message().find("tensor 'm': columns [2, 4) are not inside its 3"), std::string::npos) << beyond;
  EXPECT_EQ(ckpt->ReadFloat32Rows("m", {2, 3}, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ckpt->ReadFloat32Rows("m", {3, 2}, 0, 1).status().code(), absl::StatusCode::kInvalidArgument)
      << "the shape is checked as for a whole read";
}

TEST(CheckpointTest, IndexPointingAtTheWrongShardIsAnError) {
  TempDir dir;
  dir.Write("part-1.safetensors", MakeFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({3})));
  dir.Write("model.safetensors.index.json", R"({"weight_map": {"b": "part-1.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ckpt.status().message().find("does not hold it"), std::string::npos) << ckpt.status();
}

TEST(CheckpointTest, MissingFolderIsNotFound) {
  auto ckpt = Checkpoint::Open("/nonexistent/model");
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ckpt.status().message().find("/nonexistent/model/model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace lamina
