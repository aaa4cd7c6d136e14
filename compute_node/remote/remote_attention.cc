#include "compute_node/remote/remote_attention.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/transport/wire.h"
#include "memory_node/data_plane/attention_protocol.h"

namespace lamina {

namespace ap = attention_protocol;

RemoteAttention::RemoteAttention(Transport* transport, std::map<std::string, std::string> nodes,
                                 const AttentionWireShape& shape, absl::Duration timeout)
    : transport_(transport), shape_(shape), timeout_(timeout) {
  for (auto& [name, address] : nodes) {
    Node& node = nodes_[name];
    node.name = name;
    node.address = address;
  }
}

absl::Status RemoteAttention::Assign(SequenceId seq, const std::string& node) {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return absl::InvalidArgumentError(absl::StrCat("unknown memory node '", node, "'"));
  route_[seq] = &it->second;
  return absl::OkStatus();
}

std::vector<std::string> RemoteAttention::TakeFailedNodes() {
  std::vector<std::string> out(failed_.begin(), failed_.end());
  failed_.clear();
  return out;
}

absl::StatusOr<RemoteAttention::Node*> RemoteAttention::NodeOf(SequenceId seq) {
  auto it = route_.find(seq);
  if (it == route_.end()) return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " has no memory node"));
  return it->second;
}

absl::Status RemoteAttention::Failed(Node* node, const absl::Status& why) {
  failed_.insert(node->name);
  if (node->connection) node->connection->Close();
  node->connection.reset();  // reconnect on next use
  return absl::UnavailableError(absl::StrCat("memory node '", node->name, "' (", node->address, "): ", why.message()));
}

absl::Status RemoteAttention::SendTo(Node* node, uint32_t type, absl::Span<const ByteSpan> extra) {
  node->sent = false;
  if (!node->connection) {
    auto connection = transport_->Connect(node->address, absl::Now() + timeout_);
    if (!connection.ok()) return Failed(node, connection.status());
    node->connection = std::move(*connection);
  }
  parts_.assign(1, ByteSpan(node->send));
  parts_.insert(parts_.end(), extra.begin(), extra.end());
  absl::Status status = node->connection->Send({type, 0, next_tag_}, parts_);
  if (!status.ok()) return Failed(node, status);
  node->sent = true;
  return absl::OkStatus();
}

absl::Status RemoteAttention::AwaitReply(Node* node, const uint8_t** data, size_t* size) {
  node->sent = false;
  MessageHeader header;
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    absl::Status status = node->connection->Receive(&header, &node->receive, deadline);
    if (!status.ok()) return Failed(node, status);
    if (header.type == ap::kReply && header.tag == next_tag_) break;
    // A late reply to an abandoned request: skip it.
  }
  WireReader r(node->receive.data(), node->receive.size());
  int32_t code;
  std::string message;
  absl::Status parsed = r.Get(&code);
  if (parsed.ok()) parsed = r.GetString(&message);
  if (!parsed.ok()) return Failed(node, parsed);
  if (code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        absl::StrCat("memory node '", node->name, "': ", message));
  }
  *size = r.remaining();
  return r.GetBytes(*size, data);
}

absl::Status RemoteAttention::Reserve(absl::Span<const Reservation> reservations) {
  ScopedPause waiting(computing_);
  ++next_tag_;
  std::map<Node*, std::vector<Reservation>> by_node;
  for (const Reservation& r : reservations) {
    LAMINA_ASSIGN_OR_RETURN(Node * node, NodeOf(r.seq));
    by_node[node].push_back(r);
  }
  absl::Status first_error;
  for (auto& [node, list] : by_node) {
    node->send.clear();
    WireWriter w(&node->send);
    w.Put<uint32_t>(static_cast<uint32_t>(list.size()));
    for (const Reservation& r : list) {
      w.Put<int64_t>(r.seq);
      w.Put<int32_t>(r.end_position);
    }
    absl::Status status = SendTo(node, ap::kReserve, {});
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  for (auto& [node, list] : by_node) {
    if (!node->sent) continue;
    const uint8_t* data = nullptr;
    size_t size;
    absl::Status status = AwaitReply(node, &data, &size);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return first_error;
}

absl::Status RemoteAttention::StoreKv(int64_t layer, SequenceId seq, int32_t first_position, int64_t count,
                                      const float* k, const float* v, int64_t row_stride) {
  ScopedPause waiting(computing_);
  ++next_tag_;
  LAMINA_ASSIGN_OR_RETURN(Node * node, NodeOf(seq));
  node->send.clear();
  WireWriter w(&node->send);
  w.Put<int64_t>(layer);
  w.Put<int64_t>(seq);
  w.Put<int32_t>(first_position);
  w.Put<int64_t>(count);
  // Gather the rows' k, then their v (rows are strided inside the fused qkv buffer).
  for (const float* base : {k, v}) {
    for (int64_t t = 0; t < count; ++t) w.PutBytes(base + t * row_stride, shape_.kv_size * sizeof(float));
  }
  LAMINA_RETURN_IF_ERROR(SendTo(node, ap::kStoreKv, {}));
  const uint8_t* data = nullptr;
  size_t size;
  return AwaitReply(node, &data, &size);
}

absl::Status RemoteAttention::Decode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv,
                                     const QkvLayout& layout, float* out, int64_t out_stride) {
  ScopedBusy timed(&round_trips_);
  ScopedPause waiting(computing_);
  ++next_tag_;
  for (auto& [name, node] : nodes_) node.rows.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    LAMINA_ASSIGN_OR_RETURN(Node * node, NodeOf(entries[i].seq));
    node->rows.push_back(i);
  }
  absl::Status first_error;
  for (auto& [name, node] : nodes_) {
    if (node.rows.empty()) continue;
    node.send.clear();
    WireWriter w(&node.send);
    w.Put<int64_t>(layer);
    w.Put<uint32_t>(static_cast<uint32_t>(node.rows.size()));
    for (size_t i : node.rows) {
      w.Put<int64_t>(entries[i].seq);
      w.Put<int32_t>(entries[i].position);
    }
    for (size_t i : node.rows) {
      const float* row = qkv + i * layout.row_stride;
      w.PutBytes(row + layout.q_offset, shape_.q_size * sizeof(float));
      w.PutBytes(row + layout.k_offset, shape_.kv_size * sizeof(float));
      w.PutBytes(row + layout.v_offset, shape_.kv_size * sizeof(float));
    }
    absl::Status status = SendTo(&node, ap::kDecode, {});
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  // Every node works on its part at once; gather the outputs in turn.
  for (auto& [name, node] : nodes_) {
    if (!node.sent) continue;
    const uint8_t* data = nullptr;
    size_t size;
    absl::Status status = AwaitReply(&node, &data, &size);
    if (status.ok() && size != node.rows.size() * shape_.q_size * sizeof(float)) {
      status = Failed(&node, absl::DataLossError("attention output of the wrong size"));
    }
    if (!status.ok()) {
      if (first_error.ok()) first_error = status;
      continue;
    }
    for (size_t j = 0; j < node.rows.size(); ++j) {
      std::memcpy(out + node.rows[j] * out_stride, data + j * shape_.q_size * sizeof(float),
                  shape_.q_size * sizeof(float));
    }
  }
  return first_error;
}

void RemoteAttention::Free(SequenceId seq) {
  auto it = route_.find(seq);
  if (it == route_.end()) return;
  Node* node = it->second;
  route_.erase(it);
  ++next_tag_;
  node->send.clear();
  WireWriter w(&node->send);
  w.Put<uint32_t>(1);
  w.Put<int64_t>(seq);
  if (!SendTo(node, ap::kFree, {}).ok()) return;
  const uint8_t* data = nullptr;
  size_t size;
  AwaitReply(node, &data, &size).IgnoreError();
}

}  // namespace lamina
