// The data plane's messages between a compute node (client) and a memory node (server): the
// AttentionService calls, carried over a Connection. One request, one reply, in order, per
// connection. Floats are float32 in host order (both ends are little-endian x86-64 or Arm).
//
// Request payloads (MessageHeader::type, tag = the request's number):
//   kReserve  u32 n, n x (i64 seq, i32 end_position)
//   kStoreKv  i64 layer, i64 seq, i32 first_position, i64 count, k [count, kv_size], v [count, kv_size]
//   kDecode   i64 layer, u32 n, n x (i64 seq, i32 position), qkv rows [n, q_size + 2 kv_size]
//   kFree     u32 n, n x i64 seq
//   kOpenLink string transport, i64 max_rows, i32 max_chunks, string offer: a device-side data
//             plane for this connection's decode steps (device_link.h), replacing any earlier one
//   kBeginDecode  u64 step, u32 chunks, u32 n, n x (i64 seq, i32 position), then optionally
//             u32 m, m x i32 layer (ascending): queues the decode step's layers on the link, every
//             layer or the m listed (a compute node running only some of a batch's slices, under
//             rotational pipelining); replies once validated, then queues them
//   kBeginStore   u64 step, u32 n, n x (i64 seq, i32 first_position, i64 count, u32 transfer),
//             then optionally u32 m, m x i32 layer (ascending, as for kBeginDecode): a prefill's
//             k/v over the link (cuda_ipc), in pieces (a sequence's positions each), grouped into
//             transfers: each piece's `transfer` is the previous piece's or one more, from 0, and
//             the t pieces of a transfer travel as one send of at most StoreTransferRows rows
//             [rows, k | v], the pieces' rows in order. Transfer i of layer l is step
//             StoreTransferStep(step, l, t, i): per layer and transfer, a wait for the rows, their
//             store, and a flag back. Replies once validated, then queues every layer or the m
//             listed
//   kEndDecode    (empty): waits for the step queued last (decode or store) and replies with its
//             outcome
//   kSelectHeads  i64 first_kv_head, i64 kv_heads: this connection's later kStoreKv and kDecode
//             carry only those kv heads (a tensor-parallel rank's share, KvHeadWindow): k/v rows
//             of kv_heads x head_dim floats, q and output rows of their query heads. Host path
//             only: a connection with a window opens no device link
// Reply payload (type kReply, same tag):
//   i32 status code, string message, then for kDecode the outputs [n, q_size], for kOpenLink the
//   memory end's answer (string)
#ifndef LAMINA_DATA_PLANE_ATTENTION_PROTOCOL_H_
#define LAMINA_DATA_PLANE_ATTENTION_PROTOCOL_H_

#include <cstdint>

namespace lamina {

// The model's shape as the data plane carries it, both ends alike.
struct AttentionWireShape {
  int64_t num_layers;
  int64_t q_size;   // floats of q per token
  int64_t kv_size;  // floats of k (and of v) per token
  // The model's kv heads: a compute node's cuda_ipc links take attention outputs as packets in a
  // part a kv head (LinkShape::out_segments). 1 where unknown: the memory node then sends them
  // after its attention launch.
  int64_t num_kv_heads = 1;
  // >= 0: a tensor-parallel rank's calls, which carry only kv heads [first_kv_head, first_kv_head
  // + num_kv_heads) of the model's (the sizes above are the rank's); the connection says so first
  // (kSelectHeads).
  int64_t first_kv_head = -1;
};

namespace attention_protocol {

enum MessageType : uint32_t {
  kReserve = 1,
  kStoreKv = 2,
  kDecode = 3,
  kFree = 4,
  kOpenLink = 5,
  kBeginDecode = 6,
  kEndDecode = 7,
  kBeginStore = 8,
  kSelectHeads = 9,
  kReply = 100,
};

// A store's transfers travel layer by layer, and a link's flags must only grow: transfer i of
// layer `layer` (of n transfers) is step `first + layer * n + i`, so a store takes num_layers * n
// steps.
inline uint64_t StoreTransferStep(uint64_t first, int64_t layer, size_t n, size_t i) {
  return first + static_cast<uint64_t>(layer) * n + i;
}

// A store sends only the rows' k and v (2 kv_size floats each) into the link's receive buffer,
// which holds `max_rows` rows of q, k and v: so a transfer holds up to this many rows.
inline int64_t StoreTransferRows(int64_t max_rows, int64_t q_size, int64_t kv_size) {
  return max_rows * (q_size + 2 * kv_size) / (2 * kv_size);
}

}  // namespace attention_protocol
}  // namespace lamina

#endif  // LAMINA_DATA_PLANE_ATTENTION_PROTOCOL_H_
