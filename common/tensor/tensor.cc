#include "common/tensor/tensor.h"

#include "absl/strings/str_join.h"

namespace lamina {

std::string Tensor::ShapeString() const { return "[" + absl::StrJoin(shape_, ", ") + "]"; }

}  // namespace lamina
