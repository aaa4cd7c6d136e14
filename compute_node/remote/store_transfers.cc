#include "compute_node/remote/store_transfers.h"

namespace lamina {

int32_t AddToTransfers(const BatchRows& piece, int64_t most, std::vector<BatchRows>* transfers) {
  if (!transfers->empty()) {
    BatchRows& last = transfers->back();
    if (last.first_row + last.count == piece.first_row && last.count + piece.count <= most) {
      last.count += piece.count;
      return static_cast<int32_t>(transfers->size() - 1);
    }
  }
  transfers->push_back(piece);
  return static_cast<int32_t>(transfers->size() - 1);
}

}  // namespace lamina
