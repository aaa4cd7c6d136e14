// A dense, owning float32 tensor: the working type of the CPU engine.
// Thread-compatible. Row-major; shape()[0] is the slowest dimension.
#ifndef LAMINA_COMMON_TENSOR_TENSOR_H_
#define LAMINA_COMMON_TENSOR_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace lamina {

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape) : shape_(std::move(shape)), data_(NumElements(shape_)) {}
  Tensor(std::initializer_list<int64_t> shape) : Tensor(std::vector<int64_t>(shape)) {}

  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  // Copies are explicit (Clone) so that a large tensor is never copied by accident.
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor Clone() const {
    Tensor copy(shape_);
    copy.data_ = data_;
    return copy;
  }

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t size() const { return static_cast<int64_t>(data_.size()); }
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  // Row `i` of the tensor seen as [shape[0], everything else].
  float* row(int64_t i) { return data_.data() + i * RowSize(); }
  const float* row(int64_t i) const { return data_.data() + i * RowSize(); }
  int64_t RowSize() const { return shape_.empty() || shape_[0] == 0 ? 0 : size() / shape_[0]; }

  // Changes the shape in place; the element count must stay the same or the data is resized.
  void Reshape(std::vector<int64_t> shape) {
    shape_ = std::move(shape);
    data_.resize(NumElements(shape_));
  }

  std::string ShapeString() const;

  static int64_t NumElements(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TENSOR_TENSOR_H_
