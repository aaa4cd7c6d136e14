// The compute node's view of its memory nodes in a cluster: an AttentionService whose calls are
// split by the memory node each sequence lives on (the coordinator assigns them), sent to every
// node involved at once, and gathered. Connections are opened on first use and reused; per-node
// send buffers are kept, so a steady-state layer allocates nothing.
//
// A node that cannot be reached within `timeout` fails the call with Unavailable naming it;
// FailedNodes() lists such nodes so the caller (the coordinator, via the step result) can drop
// their sequences and retry the rest. The calls are idempotent for a retried step: Reserve grows
// to the same positions and StoreKv/Decode overwrite the same slots.
// With EnableDeviceLinks, a compute node on a GPU reaches memory nodes on GPUs over device-side
// data planes (data_plane/device_link.h): decode steps then go GPU to GPU with every
// layer queued ahead (DeviceDecode), and the connection carries only each step's plan and outcome.
// A node whose preferred transports cannot open falls back to the next one, down to the host path.
// While a device step runs, a PeerWatch aborts the link of a node whose connection closes, so that
// a dead memory node fails its sequences at once rather than after the link's timeout.
// A tensor-parallel rank's (a shape with first_kv_head) sends and receives only its heads' rows.
// Thread-compatible: one step at a time.
#ifndef LAMINA_COMPUTE_NODE_REMOTE_REMOTE_ATTENTION_H_
#define LAMINA_COMPUTE_NODE_REMOTE_REMOTE_ATTENTION_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "common/attention/attention_service.h"
#include "common/metrics/busy_meter.h"
#include "common/transport/peer_watch.h"
#include "common/transport/transport.h"
#include "compute_node/remote/store_transfers.h"
#include "data_plane/attention_protocol.h"
#include "data_plane/device_link.h"

namespace lamina {

class RemoteAttention : public AttentionService, public DeviceDecode {
 public:
  // `nodes`: memory node name -> data-plane address.
  RemoteAttention(Transport* transport, const std::map<std::string, std::string>& nodes, const AttentionWireShape& shape,
                  absl::Duration timeout = absl::Seconds(10));

  // Routes `seq` to memory node `node` (which must be one of `nodes`).
  absl::Status Assign(SequenceId seq, const std::string& node);
  // Drops the routing of a finished sequence (its slots are freed by the coordinator).
  void Forget(SequenceId seq) { route_.erase(seq); }
  // A memory node that failed, and the error it failed with (naming the node and its address).
  struct FailedNode {
    std::string name;
    std::string reason;
  };
  // Nodes that failed since the last call, each with its first error, by name; clears the list.
  std::vector<FailedNode> TakeFailedNodes();
  // Per-layer Decode round trips: q/k/v out to every node involved, outputs back.
  const BusyMeter& round_trips() const { return round_trips_; }
  // While this waits on a memory node (every data-plane call), `computing` is paused: the
  // caller's compute time leaves out the waits. Null (the default): nothing is paused.
  void set_compute_meter(BusyUnion* computing) { computing_ = computing; }

  // Device-side data planes from GPU `device` (none for a tensor-parallel rank's share of the
  // heads, AttentionWireShape::first_kv_head): memory node `name` is tried over
  // transports.at(name) in order ("cuda_ipc", "nccl"; "tcp" is the host path and ends the list),
  // the first that opens serving its decode steps of up to `max_rows` rows. A node missing from
  // `transports` stays on the host path. A layer travels as up to `max_chunks` mini-batches of at
  // least `chunk_rows` rows (ChunksFor), each with its own flag, so that the memory node attends
  // to the first while the rest are in flight.
  void EnableDeviceLinks(int device, int64_t max_rows, std::map<std::string, std::vector<std::string>> transports,
                         int max_chunks = 1, int64_t chunk_rows = 32);
  // Over cuda_ipc, a chunk of 1 to `rows` rows travels as lines (kernels/cuda/line.h) rather than
  // rows behind a flag (LinkShape::line_rows); 0: never. For links opened after the call.
  void set_line_rows(int64_t rows) { line_rows_ = rows; }
  // Over cuda_ipc between GPUs joined by NVLink, a chunk of more than the line rows and at most
  // `rows` rows travels as packets (kernels/cuda/packets.h) rather than rows behind a flag
  // (LinkShape::packet_rows); 0 (the default): never. For links opened after the call.
  void set_packet_rows(int64_t rows) { packet_rows_ = rows; }
  // Opens the device links now (after EnableDeviceLinks and set_line_rows), waiting until
  // `deadline` for memory nodes not yet listening; those still unreachable then open theirs on
  // first use, as any does after its connection drops. A compute node calls it before it
  // registers, so that no step's first exchange waits for a link to open (GPU memory allocated
  // and mapped on both ends) while other nodes' waits for it spin.
  void OpenDeviceLinks(absl::Time deadline);
  // Times every layer's round trip over the device links on the compute GPU's clock, for
  // benchmarks: the links open now and those opened later keep `clocks` ([num_layers, 2] words on
  // the GPU; ComputeLinkEnd::SetHopClock), each layer's words spanning every node's exchange of it.
  // Unimplemented when an open link cannot (nccl); null stops.
  absl::Status SetHopClock(uint64_t* clocks);

  absl::Status Reserve(absl::Span<const Reservation> reservations) override;
  // Sends the rows and returns: up to kMaxPendingStores stores per node are in flight, and their
  // replies are read by FlushStores, or before the node's next other request.
  absl::Status StoreKv(int64_t layer, SequenceId seq, int32_t first_position, int64_t count, const float* k,
                       const float* v, int64_t row_stride) override;
  absl::Status FlushStores() override;
  // Decode in two halves, so that the caller can work while the memory nodes attend: SendDecode
  // sends each node its rows; GatherDecode (once after each SendDecode, even a failed one) waits
  // for the outputs and writes them to `out` [entries, out_stride]. The first error of either,
  // with failed nodes reported as for Decode.
  absl::Status SendDecode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv,
                          const QkvLayout& layout);
  absl::Status GatherDecode(float* out, int64_t out_stride);
  absl::Status Decode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv, const QkvLayout& layout,
                      float* out, int64_t out_stride) override;
  void Free(SequenceId seq) override;

  DeviceDecode* device_decode() override { return device_ >= 0 ? this : nullptr; }
  bool CanDecodeOnDevice(absl::Span<const DecodeEntry> entries, const QkvLayout& layout) override;
  absl::Status BeginDeviceDecode(absl::Span<const DecodeEntry> entries, absl::Span<const int64_t> layers) override;
  absl::Status QueueDeviceDecode(int64_t layer, const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                                 CUstream_st* stream) override;
  absl::Status EndDeviceDecode() override;
  void AbandonDeviceStep() override;
  // Only the rows' k and v travel: a memory node's prompts whose rows follow each other in the
  // batch in one send of at most attention_protocol::StoreTransferRows rows (per layer), so that
  // a prefill of many short prompts queues a few launches a layer, not a few per prompt.
  bool CanStoreOnDevice(absl::Span<const PromptRows> prompts) override;
  absl::Status BeginDeviceStore(absl::Span<const PromptRows> prompts, absl::Span<const int64_t> layers) override;
  absl::Status QueueDeviceStore(int64_t layer, const float* qkv, int64_t qkv_stride, CUstream_st* stream) override;
  absl::Status EndDeviceStore() override { return EndDeviceDecode(); }

 private:
  struct Node {
    std::string name;
    std::string address;
    std::unique_ptr<Connection> connection;
    std::vector<uint8_t> send;      // request payload, reused
    std::vector<uint8_t> receive;   // reply payload, reused
    std::vector<size_t> rows;       // Decode: which entries went to this node
    bool sent = false;
    // Device-side data plane: the transports to try, in order; the link once open (reset with
    // the connection); whether this connection tried already.
    std::vector<std::string> transports;
    std::unique_ptr<ComputeLinkEnd> link;
    bool link_tried = false;
    std::string link_error;  // why no transport of the list opened, when "tcp" is not on it
    int chunks = 1;                  // this step's chunks
    // The first exchange of this step that the link refused (an nccl link refuses every one once
    // aborted). The node gets no more of the step's exchanges and fails at its end, while the
    // others get all of theirs: a peer matches exchanges by their order, so one left out would
    // pair every later one with the wrong data.
    absl::Status queue_error;
    std::deque<uint64_t> pending_stores;  // the tags of StoreKv requests not yet answered, oldest first
    // A device-side store: its pieces (a sequence's positions each, as kBeginStore lists them),
    // its transfers (rows of the prefill batch, one send each: store_transfers.h) and its first
    // step.
    struct StorePiece {
      SequenceId seq;
      int32_t first_position;
      int64_t count;
      int32_t transfer;
    };
    std::vector<StorePiece> store_pieces;
    std::vector<BatchRows> store_transfers;
    uint64_t store_step = 0;
    // The transfer sent last and not yet acknowledged: the next send waits for its store.
    bool unacked = false;
    uint64_t unacked_step = 0;
    int64_t unacked_layer = 0;
  };

  static constexpr size_t kMaxPendingStores = 64;

  absl::StatusOr<Node*> NodeOf(SequenceId seq);
  absl::Status SendTo(Node* node, uint32_t type, absl::Span<const ByteSpan> extra);
  // Waits for the reply to the last request sent to `node`; on success leaves the reply's data
  // (after the status) at `data`.
  absl::Status AwaitReply(Node* node, const uint8_t** data, size_t* size);
  // Reads replies until the one tagged `tag` (skipping late ones); on success leaves its data.
  absl::Status AwaitTagged(Node* node, uint64_t tag, const uint8_t** data, size_t* size);
  // Reads the reply to the node's oldest pending StoreKv: its error, if any.
  absl::Status AwaitStore(Node* node);
  // Reads the replies to every pending StoreKv of the node: the first error.
  absl::Status DrainStores(Node* node);
  // Reads the replies to a step's begin (the nodes with a request sent): those that began make
  // the step's nodes. On any error, `first_error` or a reply's, none begins: the ones that did are
  // dropped. Returns the first error.
  absl::Status AwaitBegun(absl::Status first_error);
  // Reports the node failed (TakeFailedNodes), drops it, and returns Unavailable naming it.
  absl::Status Failed(Node* node, const absl::Status& why);
  // Closes the node's connection and link, to be opened afresh on next use (disarming the watch,
  // which must not look at a link gone).
  void Drop(Node* node);
  // Connects if needed, then opens the node's device link unless tried on this connection.
  void EnsureLink(Node* node);
  // Opens a link of `transport` on the node's connection (a kOpenLink round trip).
  absl::Status OpenLink(Node* node, const std::string& transport);
  absl::Status Connect(Node* node);
  // Splits `entries` by node into Node::rows; InvalidArgument for an unrouted sequence.
  absl::Status SplitByNode(absl::Span<const DecodeEntry> entries);

  Transport* transport_;
  AttentionWireShape shape_;
  absl::Duration timeout_;
  std::map<std::string, Node> nodes_;
  absl::flat_hash_map<SequenceId, Node*> route_;
  std::map<std::string, std::string> failed_;  // name -> its first error since TakeFailedNodes
  std::vector<ByteSpan> parts_;  // SendTo's scratch
  std::vector<ByteSpan> row_parts_;  // SendDecode's scratch: runs of rows sent from the caller's buffer
  uint64_t next_tag_ = 1;
  BusyMeter round_trips_;
  BusyUnion* computing_ = nullptr;
  absl::Time decode_sent_at_;   // SendDecode's start
  absl::Status decode_error_;   // the first send's error, for GatherDecode
  // Device-side data planes.
  int device_ = -1;
  int64_t max_rows_ = 0;
  int max_chunks_ = 1;
  int64_t chunk_rows_ = 32;
  int64_t line_rows_ = 0;
  int64_t packet_rows_ = 0;
  uint64_t device_step_ = 0;
  uint64_t* hop_clock_ = nullptr;  // SetHopClock's, or null
  int64_t store_first_layer_ = 0;  // the device store's first and last layer
  int64_t store_last_layer_ = 0;
  std::vector<Node*> step_nodes_;  // the nodes of the device step in flight
  PeerWatch watch_;                // armed from a device step's begin to its end; stopped first
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_REMOTE_REMOTE_ATTENTION_H_
