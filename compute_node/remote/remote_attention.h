// The compute node's view of its memory nodes in a cluster: an AttentionService whose calls are
// split by the memory node each sequence lives on (the coordinator assigns them), sent to every
// node involved at once, and gathered. Connections are opened on first use and reused; per-node
// send buffers are kept, so a steady-state layer allocates nothing.
//
// A node that cannot be reached within `timeout` fails the call with Unavailable naming it;
// FailedNodes() lists such nodes so the caller (the coordinator, via the step result) can drop
// their sequences and retry the rest. The calls are idempotent for a retried step: Reserve grows
// to the same positions and StoreKv/Decode overwrite the same slots.
// Thread-compatible: one step at a time.
#ifndef LAMINA_COMPUTE_NODE_REMOTE_REMOTE_ATTENTION_H_
#define LAMINA_COMPUTE_NODE_REMOTE_REMOTE_ATTENTION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/attention/attention_service.h"
#include "common/metrics/busy_meter.h"
#include "common/transport/transport.h"
#include "memory_node/data_plane/attention_server.h"

namespace lamina {

class RemoteAttention : public AttentionService {
 public:
  // `nodes`: memory node name -> data-plane address.
  RemoteAttention(Transport* transport, std::map<std::string, std::string> nodes, const AttentionWireShape& shape,
                  absl::Duration timeout = absl::Seconds(10));

  // Routes `seq` to memory node `node` (which must be one of `nodes`).
  absl::Status Assign(SequenceId seq, const std::string& node);
  // Drops the routing of a finished sequence (its slots are freed by the coordinator).
  void Forget(SequenceId seq) { route_.erase(seq); }
  // Nodes that failed since the last call, and clears the list.
  std::vector<std::string> TakeFailedNodes();
  // Per-layer Decode round trips: q/k/v out to every node involved, outputs back.
  const BusyMeter& round_trips() const { return round_trips_; }
  // While this waits on a memory node (every data-plane call), `computing` is paused: the
  // caller's compute time leaves out the waits. Null (the default): nothing is paused.
  void set_compute_meter(BusyUnion* computing) { computing_ = computing; }

  absl::Status Reserve(absl::Span<const Reservation> reservations) override;
  absl::Status StoreKv(int64_t layer, SequenceId seq, int32_t first_position, int64_t count, const float* k,
                       const float* v, int64_t row_stride) override;
  absl::Status Decode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv, const QkvLayout& layout,
                      float* out, int64_t out_stride) override;
  void Free(SequenceId seq) override;

 private:
  struct Node {
    std::string name;
    std::string address;
    std::unique_ptr<Connection> connection;
    std::vector<uint8_t> send;      // request payload, reused
    std::vector<uint8_t> receive;   // reply payload, reused
    std::vector<size_t> rows;       // Decode: which entries went to this node
    bool sent = false;
  };

  absl::StatusOr<Node*> NodeOf(SequenceId seq);
  absl::Status SendTo(Node* node, uint32_t type, absl::Span<const ByteSpan> extra);
  // Waits for the reply to the last request sent to `node`; on success leaves the reply's data
  // (after the status) at `data`.
  absl::Status AwaitReply(Node* node, const uint8_t** data, size_t* size);
  absl::Status Failed(Node* node, const absl::Status& why);

  Transport* transport_;
  AttentionWireShape shape_;
  absl::Duration timeout_;
  std::map<std::string, Node> nodes_;
  absl::flat_hash_map<SequenceId, Node*> route_;
  std::set<std::string> failed_;
  std::vector<ByteSpan> parts_;  // SendTo's scratch
  uint64_t next_tag_ = 1;
  BusyMeter round_trips_;
  BusyUnion* computing_ = nullptr;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_REMOTE_REMOTE_ATTENTION_H_
