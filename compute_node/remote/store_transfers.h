// How a compute node groups a prefill's k/v into transfers over a device link (kBeginStore in
// data_plane/attention_protocol.h): a memory node's pieces, in order, each a run of
// rows of the prefill batch, join the transfer before them while their rows follow its rows in the
// batch and the transfer stays within the link's most rows; otherwise they start a new one. One
// transfer is one send, one store and one flag back a layer, so a prefill of many short prompts
// for one memory node costs a few launches a layer rather than a few per prompt.
#ifndef LAMINA_COMPUTE_NODE_REMOTE_STORE_TRANSFERS_H_
#define LAMINA_COMPUTE_NODE_REMOTE_STORE_TRANSFERS_H_

#include <cstdint>
#include <vector>

namespace lamina {

// Rows [first_row, first_row + count) of the prefill batch.
struct BatchRows {
  int64_t first_row = 0;
  int64_t count = 0;
};

// Adds the piece `piece` (count <= most) to `transfers` as above; the index of the transfer it
// went to.
int32_t AddToTransfers(const BatchRows& piece, int64_t most, std::vector<BatchRows>* transfers);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_REMOTE_STORE_TRANSFERS_H_
