#include "compute_node/remote/remote_attention.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status/status_macros.h"
#include "common/threading/quiescent_release.h"
#include "common/transport/wire.h"
#include "data_plane/attention_protocol.h"

namespace lamina {

namespace ap = attention_protocol;

namespace {

// u32 n, then (i64 seq, i32 position) of entries[rows[0..n)].
void PutEntries(absl::Span<const DecodeEntry> entries, const std::vector<size_t>& rows, WireWriter* w) {
  w->Put<uint32_t>(static_cast<uint32_t>(rows.size()));
  for (size_t i : rows) {
    w->Put<int64_t>(entries[i].seq);
    w->Put<int32_t>(entries[i].position);
  }
}

// A device step's layer list, where it names some: u32 m, m x i32 layer. Nothing for every layer.
void PutLayers(absl::Span<const int64_t> layers, WireWriter* w) {
  if (layers.empty()) return;
  w->Put<uint32_t>(static_cast<uint32_t>(layers.size()));
  for (const int64_t layer : layers) w->Put<int32_t>(static_cast<int32_t>(layer));
}

}  // namespace

RemoteAttention::RemoteAttention(Transport* transport, const std::map<std::string, std::string>& nodes,
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

std::vector<RemoteAttention::FailedNode> RemoteAttention::TakeFailedNodes() {
  std::vector<FailedNode> out;
  for (auto& [name, reason] : failed_) out.push_back({name, std::move(reason)});
  failed_.clear();
  return out;
}

absl::StatusOr<RemoteAttention::Node*> RemoteAttention::NodeOf(SequenceId seq) {
  auto it = route_.find(seq);
  if (it == route_.end()) return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " has no memory node"));
  return it->second;
}

void RemoteAttention::Drop(Node* node) {
  watch_.Disarm();
  if (node->connection) node->connection->Close();
  node->connection.reset();  // reconnect on next use
  // The memory end was the connection's. Freeing the link's memory now would wait for the
  // device steps of this node's other batch runners (quiescent_release.h).
  QuiescentRelease::Process().Retire(std::move(node->link));
  node->link_tried = false;
  node->pending_stores.clear();  // their replies will never come
}

absl::Status RemoteAttention::Failed(Node* node, const absl::Status& why) {
  std::string reason = absl::StrCat("memory node '", node->name, "' (", node->address, "): ", why.message());
  failed_.emplace(node->name, reason);  // a node's first error is kept
  Drop(node);
  return absl::UnavailableError(reason);
}

absl::Status RemoteAttention::Connect(Node* node) {
  if (node->connection) return absl::OkStatus();
  auto connection = transport_->Connect(node->address, absl::Now() + timeout_);
  if (!connection.ok()) return Failed(node, connection.status());
  node->connection = std::move(*connection);
  if (shape_.first_kv_head < 0) return absl::OkStatus();
  // A tensor-parallel rank's share of the heads, said once per connection (its own buffers: the
  // caller may have a request ready in node->send).
  std::vector<uint8_t> select;
  WireWriter w(&select);
  w.Put<int64_t>(shape_.first_kv_head);
  w.Put<int64_t>(shape_.num_kv_heads);
  constexpr uint64_t tag = 0;  // no request's (they count from 1), and next_tag_ stays the caller's
  const ByteSpan parts[] = {select};
  if (absl::Status sent = node->connection->Send({ap::kSelectHeads, 0, tag}, parts); !sent.ok()) {
    return Failed(node, sent);
  }
  const uint8_t* data = nullptr;
  size_t size;
  absl::Status selected = AwaitTagged(node, tag, &data, &size);
  if (!selected.ok() && node->connection) Drop(node);  // selects again on the next use
  return selected;
}

absl::Status RemoteAttention::SendTo(Node* node, uint32_t type, absl::Span<const ByteSpan> extra) {
  node->sent = false;
  // Replies come in request order: the stores' go first. Their errors belong to the prefill that
  // made them, which reports them through FlushStores; here only a broken connection matters.
  if (type != ap::kStoreKv && !node->pending_stores.empty()) {
    absl::Status drained = DrainStores(node);
    if (!node->connection) return drained;
  }
  LAMINA_RETURN_IF_ERROR(Connect(node));
  parts_.assign(1, ByteSpan(node->send));
  parts_.insert(parts_.end(), extra.begin(), extra.end());
  absl::Status status = node->connection->Send({type, 0, next_tag_}, parts_);
  if (!status.ok()) return Failed(node, status);
  node->sent = true;
  return absl::OkStatus();
}

absl::Status RemoteAttention::AwaitReply(Node* node, const uint8_t** data, size_t* size) {
  return AwaitTagged(node, next_tag_, data, size);
}

absl::Status RemoteAttention::AwaitStore(Node* node) {
  const uint64_t tag = node->pending_stores.front();
  node->pending_stores.pop_front();
  const uint8_t* data = nullptr;
  size_t size;
  return AwaitTagged(node, tag, &data, &size);
}

absl::Status RemoteAttention::DrainStores(Node* node) {
  absl::Status first_error;
  while (!node->pending_stores.empty()) {
    if (!node->connection) {  // failed while draining: the rest will never be answered
      node->pending_stores.clear();
      break;
    }
    absl::Status status = AwaitStore(node);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return first_error;
}

absl::Status RemoteAttention::FlushStores() {
  ScopedPause waiting(computing_);
  absl::Status first_error;
  for (auto& [name, node] : nodes_) {
    absl::Status status = DrainStores(&node);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return first_error;
}

absl::Status RemoteAttention::AwaitTagged(Node* node, uint64_t tag, const uint8_t** data, size_t* size) {
  node->sent = false;
  MessageHeader header;
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    absl::Status status = node->connection->Receive(&header, &node->receive, deadline);
    if (!status.ok()) return Failed(node, status);
    if (header.type == ap::kReply && header.tag == tag) break;
    // A late reply to an abandoned request: skip it.
  }
  WireReader r(node->receive.data(), node->receive.size());
  int32_t code;
  std::string message;
  absl::Status parsed = r.Get(&code);
  if (parsed.ok()) parsed = r.GetString(&message);
  if (!parsed.ok()) return Failed(node, parsed);
  if (code != 0) {
    // The node's state no longer matches the coordinator's (a node restarted and lost its
    // sequences, say): reported failed like an unreachable one, so that only its sequences move,
    // but its connection stays.
    const absl::Status error(static_cast<absl::StatusCode>(code),
                             absl::StrCat("memory node '", node->name, "': ", message));
    failed_.emplace(node->name, std::string(error.message()));
    return error;
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
  LAMINA_ASSIGN_OR_RETURN(Node * node, NodeOf(seq));
  if (node->pending_stores.size() >= kMaxPendingStores) LAMINA_RETURN_IF_ERROR(AwaitStore(node));
  ++next_tag_;
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
  node->pending_stores.push_back(next_tag_);
  return absl::OkStatus();
}

absl::Status RemoteAttention::Decode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv,
                                     const QkvLayout& layout, float* out, int64_t out_stride) {
  const absl::Status sent = SendDecode(layer, entries, qkv, layout);
  const absl::Status gathered = GatherDecode(out, out_stride);
  return sent.ok() ? gathered : sent;
}

absl::Status RemoteAttention::SendDecode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv,
                                         const QkvLayout& layout) {
  decode_sent_at_ = absl::Now();
  decode_error_ = absl::OkStatus();
  ++next_tag_;
  for (auto& [name, node] : nodes_) node.sent = false;
  LAMINA_RETURN_IF_ERROR(SplitByNode(entries));
  for (auto& [name, node] : nodes_) {
    if (node.rows.empty() || node.link_error.empty()) continue;
    // The topology allows this node only device links, and none opened.
    return absl::FailedPreconditionError(absl::StrCat("memory node '", name, "': no transport the topology allows ",
                                                      "opened (", node.link_error, ")"));
  }
  // Rows laid out as the wire has them (q, k, v back to back) go from the caller's buffer as they
  // are, a run of consecutive rows a part, rather than through a copy.
  const int64_t row_floats = shape_.q_size + 2 * shape_.kv_size;
  const bool wire_layout = layout.q_offset == 0 && layout.k_offset == shape_.q_size &&
                           layout.v_offset == shape_.q_size + shape_.kv_size && layout.row_stride >= row_floats;
  for (auto& [name, node] : nodes_) {
    if (node.rows.empty()) continue;
    node.send.clear();
    row_parts_.clear();
    WireWriter w(&node.send);
    w.Put<int64_t>(layer);
    PutEntries(entries, node.rows, &w);
    for (size_t j = 0; j < node.rows.size(); ++j) {
      const size_t i = node.rows[j];
      const float* row = qkv + i * layout.row_stride;
      if (!wire_layout) {
        w.PutBytes(row + layout.q_offset, shape_.q_size * sizeof(float));
        w.PutBytes(row + layout.k_offset, shape_.kv_size * sizeof(float));
        w.PutBytes(row + layout.v_offset, shape_.kv_size * sizeof(float));
        continue;
      }
      const auto* bytes = reinterpret_cast<const uint8_t*>(row);
      const size_t size = row_floats * sizeof(float);
      const bool follows = j > 0 && node.rows[j - 1] + 1 == i && layout.row_stride == row_floats;
      if (follows) {
        row_parts_.back() = ByteSpan(row_parts_.back().data(), row_parts_.back().size() + size);
      } else {
        row_parts_.push_back(ByteSpan(bytes, size));
      }
    }
    absl::Status status = SendTo(&node, ap::kDecode, row_parts_);
    if (!status.ok() && decode_error_.ok()) decode_error_ = status;
  }
  return absl::OkStatus();
}

absl::Status RemoteAttention::GatherDecode(float* out, int64_t out_stride) {
  ScopedPause waiting(computing_);
  absl::Status first_error = decode_error_;
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
  round_trips_.Add(absl::Now() - decode_sent_at_);
  return first_error;
}

absl::Status RemoteAttention::SplitByNode(absl::Span<const DecodeEntry> entries) {
  for (auto& [name, node] : nodes_) node.rows.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    LAMINA_ASSIGN_OR_RETURN(Node * node, NodeOf(entries[i].seq));
    node->rows.push_back(i);
  }
  return absl::OkStatus();
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

void RemoteAttention::EnableDeviceLinks(int device, int64_t max_rows,
                                        std::map<std::string, std::vector<std::string>> transports, int max_chunks,
                                        int64_t chunk_rows) {
  if (shape_.first_kv_head >= 0) return;  // links carry whole heads: a rank's share stays on the host path
  device_ = device;
  max_rows_ = max_rows;
  // The most chunks a step of up to max_rows rows takes: the memory nodes make a stream for each
  // when the link opens (kv_backend.h). More than a step needs are not harmless: with four a lane
  // where steps took one, rotation over two compute GPUs stalled once (not traced further).
  max_chunks_ = ChunksFor(max_rows, std::max(1, max_chunks), chunk_rows);
  chunk_rows_ = chunk_rows;
  for (auto& [name, node] : nodes_) {
    auto it = transports.find(name);
    node.transports = it == transports.end() ? std::vector<std::string>{} : it->second;
    node.link.reset();
    node.link_tried = false;
  }
}

absl::Status RemoteAttention::OpenLink(Node* node, const std::string& transport) {
  LinkShape shape{shape_.num_layers, shape_.q_size + 2 * shape_.kv_size, shape_.q_size, max_rows_,
                  max_chunks_, timeout_};
  shape.line_rows = std::min(line_rows_, max_rows_);
  shape.packet_rows = std::min(packet_rows_, max_rows_);
  shape.out_segments = shape_.num_kv_heads;
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ComputeLinkEnd> end, CreateComputeLinkEnd(transport, shape, device_));
  auto handshake = [&]() -> absl::Status {
    ++next_tag_;
    node->send.clear();
    WireWriter w(&node->send);
    w.PutString(transport);
    w.Put<int64_t>(max_rows_);
    w.Put<int32_t>(max_chunks_);
    w.PutString(end->Offer());
    LAMINA_RETURN_IF_ERROR(SendTo(node, ap::kOpenLink, {}));
    const uint8_t* data = nullptr;
    size_t size;
    LAMINA_RETURN_IF_ERROR(AwaitReply(node, &data, &size));
    WireReader r(data, size);
    std::string answer;
    LAMINA_RETURN_IF_ERROR(r.GetString(&answer));
    return end->Accept(answer);
  };
  absl::Status opened = handshake();
  if (!opened.ok()) {
    QuiescentRelease::Process().Retire(std::move(end));
    return opened;
  }
  // A clock the link cannot keep (nccl) leaves its layers untimed; the link still serves.
  if (hop_clock_ != nullptr) end->SetHopClock(hop_clock_).IgnoreError();
  node->link = std::move(end);
  return absl::OkStatus();
}

absl::Status RemoteAttention::SetHopClock(uint64_t* clocks) {
  hop_clock_ = clocks;
  for (auto& [name, node] : nodes_) {
    if (node.link) LAMINA_RETURN_IF_ERROR(node.link->SetHopClock(clocks));
  }
  return absl::OkStatus();
}

void RemoteAttention::EnsureLink(Node* node) {
  if (node->link_tried || device_ < 0) return;
  if (!Connect(node).ok()) return;  // the step's first call reports it
  node->link_tried = true;
  node->link_error.clear();
  for (const std::string& transport : node->transports) {
    if (transport == "tcp") {
      node->link_error.clear();  // the host path is allowed
      return;
    }
    absl::Status opened = OpenLink(node, transport);
    if (opened.ok()) {
      std::fprintf(stderr, "memory node '%s': decode over %s\n", node->name.c_str(), transport.c_str());
      return;
    }
    if (!node->connection) return;  // the connection broke: try again once reconnected
    std::fprintf(stderr, "memory node '%s': %s unavailable (%s)\n", node->name.c_str(), transport.c_str(),
                 std::string(opened.message()).c_str());
    absl::StrAppend(&node->link_error, node->link_error.empty() ? "" : "; ", transport, ": ", opened.message());
  }
}

void RemoteAttention::OpenDeviceLinks(absl::Time deadline) {
  if (device_ < 0) return;
  for (auto& [name, node] : nodes_) {
    while (!Connect(&node).ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(200));
    EnsureLink(&node);
  }
  failed_.clear();  // nothing was asked of the nodes yet: a step reports their failures
}

bool RemoteAttention::CanDecodeOnDevice(absl::Span<const DecodeEntry> entries, const QkvLayout& layout) {
  if (device_ < 0 || entries.empty()) return false;
  // The links send whole rows of [q | k | v].
  if (layout.q_offset != 0 || layout.k_offset != shape_.q_size || layout.v_offset != shape_.q_size + shape_.kv_size) {
    return false;
  }
  if (!SplitByNode(entries).ok()) return false;
  for (auto& [name, node] : nodes_) {
    if (node.rows.empty()) continue;
    EnsureLink(&node);
    if (!node.link || static_cast<int64_t>(node.rows.size()) > max_rows_) return false;
  }
  return true;
}

absl::Status RemoteAttention::BeginDeviceDecode(absl::Span<const DecodeEntry> entries,
                                                absl::Span<const int64_t> layers) {
  ScopedPause waiting(computing_);
  LAMINA_RETURN_IF_ERROR(SplitByNode(entries));
  ++device_step_;
  ++next_tag_;
  step_nodes_.clear();
  absl::Status first_error;
  std::vector<int32_t> rows;
  for (auto& [name, node] : nodes_) {
    if (node.rows.empty()) continue;
    if (!node.link) return absl::FailedPreconditionError(absl::StrCat("memory node '", name, "' has no device link"));
    rows.assign(node.rows.begin(), node.rows.end());
    absl::Status status = node.link->SetRows(rows);
    node.chunks =
        ChunksFor(static_cast<int64_t>(rows.size()), std::min(max_chunks_, node.link->max_chunks()), chunk_rows_);
    node.queue_error = absl::OkStatus();
    node.send.clear();
    WireWriter w(&node.send);
    w.Put<uint64_t>(device_step_);
    w.Put<uint32_t>(static_cast<uint32_t>(node.chunks));
    PutEntries(entries, node.rows, &w);
    PutLayers(layers, &w);
    if (status.ok()) status = SendTo(&node, ap::kBeginDecode, {});
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return AwaitBegun(first_error);
}

absl::Status RemoteAttention::AwaitBegun(absl::Status first_error) {
  for (auto& [name, node] : nodes_) {
    if (!node.sent) continue;
    const uint8_t* data = nullptr;
    size_t size;
    absl::Status status = AwaitReply(&node, &data, &size);
    if (status.ok()) {
      step_nodes_.push_back(&node);
    } else if (first_error.ok()) {
      first_error = status;
    }
  }
  if (!first_error.ok()) {
    // The nodes that began would wait for their rows until their timeout: drop their connections,
    // so the next step starts afresh on new links. They did nothing wrong: they are not reported
    // as failed, which would end their sequences too.
    for (Node* node : step_nodes_) Drop(node);
    step_nodes_.clear();
    return first_error;
  }
  std::vector<PeerWatch::Watched> watched;
  for (Node* node : step_nodes_) {
    ComputeLinkEnd* link = node->link.get();
    watched.push_back({absl::StrCat("memory node '", node->name, "' (", link->transport(), ")"), node->connection.get(),
                       [link] { return link->Abort(); }});
  }
  watch_.Arm(std::move(watched));
  return absl::OkStatus();
}

absl::Status RemoteAttention::QueueDeviceDecode(int64_t layer, const float* qkv, int64_t qkv_stride, float* out,
                                                int64_t out_stride, CUstream_st* stream) {
  // A node whose link refuses an exchange is left out from then on (Node::queue_error), and the
  // others still get every exchange of the step; its failure is reported by EndDeviceDecode.
  for (Node* node : step_nodes_) {
    for (int c = 0; c < node->chunks && node->queue_error.ok(); ++c) {
      node->queue_error = node->link->QueueSend(device_step_, layer, c, node->chunks, qkv, qkv_stride, stream);
    }
  }
  for (Node* node : step_nodes_) {
    for (int c = 0; c < node->chunks && node->queue_error.ok(); ++c) {
      node->queue_error = node->link->QueueReceive(device_step_, layer, c, node->chunks, out, out_stride, stream);
    }
  }
  return absl::OkStatus();
}

bool RemoteAttention::CanStoreOnDevice(absl::Span<const PromptRows> prompts) {
  if (device_ < 0 || prompts.empty() || max_rows_ < 1) return false;
  for (const PromptRows& p : prompts) {
    absl::StatusOr<Node*> node = NodeOf(p.seq);
    if (!node.ok()) return false;
    EnsureLink(*node);
    if (!(*node)->link || !(*node)->link->can_send_rows()) return false;
  }
  return true;
}

absl::Status RemoteAttention::BeginDeviceStore(absl::Span<const PromptRows> prompts,
                                               absl::Span<const int64_t> layers) {
  ScopedPause waiting(computing_);
  if (max_rows_ < 1) return absl::FailedPreconditionError("no device links are enabled");
  store_first_layer_ = layers.empty() ? 0 : layers.front();
  store_last_layer_ = layers.empty() ? shape_.num_layers - 1 : layers.back();
  for (auto& [name, node] : nodes_) {
    node.store_pieces.clear();
    node.store_transfers.clear();
  }
  const int64_t most = ap::StoreTransferRows(max_rows_, shape_.q_size, shape_.kv_size);
  for (const PromptRows& p : prompts) {
    LAMINA_ASSIGN_OR_RETURN(Node * node, NodeOf(p.seq));
    for (int64_t offset = 0; offset < p.count; offset += most) {
      const BatchRows piece{p.first_row + offset, std::min(most, p.count - offset)};
      const int32_t transfer = AddToTransfers(piece, most, &node->store_transfers);
      node->store_pieces.push_back({p.seq, static_cast<int32_t>(offset), piece.count, transfer});
    }
  }
  ++next_tag_;
  step_nodes_.clear();
  absl::Status first_error;
  for (auto& [name, node] : nodes_) {
    if (node.store_pieces.empty()) continue;
    if (!node.link) return absl::FailedPreconditionError(absl::StrCat("memory node '", name, "' has no device link"));
    node.store_step = device_step_ + 1;
    device_step_ += static_cast<uint64_t>(shape_.num_layers) * node.store_transfers.size();
    node.send.clear();
    WireWriter w(&node.send);
    w.Put<uint64_t>(node.store_step);
    w.Put<uint32_t>(static_cast<uint32_t>(node.store_pieces.size()));
    for (const Node::StorePiece& piece : node.store_pieces) {
      w.Put<int64_t>(piece.seq);
      w.Put<int32_t>(piece.first_position);
      w.Put<int64_t>(piece.count);
      w.Put<uint32_t>(static_cast<uint32_t>(piece.transfer));
    }
    PutLayers(layers, &w);
    absl::Status status = SendTo(&node, ap::kBeginStore, {});
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  return AwaitBegun(first_error);
}

absl::Status RemoteAttention::QueueDeviceStore(int64_t layer, const float* qkv, int64_t qkv_stride,
                                               CUstream_st* stream) {
  // A transfer waits only for the one before it to be stored (the memory node has one receive
  // buffer), so each store overlaps the compute queued after its send; the last layer's last
  // transfer is awaited at once, before the stream's end.
  for (Node* node : step_nodes_) {
    const size_t n = node->store_transfers.size();
    if (layer == store_first_layer_) node->unacked = false;
    for (size_t i = 0; i < n; ++i) {
      const BatchRows& transfer = node->store_transfers[i];
      if (node->unacked) {
        LAMINA_RETURN_IF_ERROR(node->link->QueueAwait(node->unacked_step, node->unacked_layer, stream));
      }
      const uint64_t step = ap::StoreTransferStep(node->store_step, layer, n, i);
      // Only k and v, which follow q in each row.
      const float* kv = qkv + transfer.first_row * qkv_stride + shape_.q_size;
      LAMINA_RETURN_IF_ERROR(node->link->QueueSendRows(step, layer, kv, transfer.count, qkv_stride, stream));
      node->unacked = true;
      node->unacked_step = step;
      node->unacked_layer = layer;
    }
    if (layer == store_last_layer_) {
      LAMINA_RETURN_IF_ERROR(node->link->QueueAwait(node->unacked_step, node->unacked_layer, stream));
      node->unacked = false;
    }
  }
  return absl::OkStatus();
}

absl::Status RemoteAttention::EndDeviceDecode() {
  ScopedPause waiting(computing_);
  watch_.Disarm();  // the step's work is done: a node's close is now the replies' to tell
  ++next_tag_;
  absl::Status first_error;
  for (Node* node : step_nodes_) {
    node->send.clear();
    absl::Status status = SendTo(node, ap::kEndDecode, {});
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  for (Node* node : step_nodes_) {
    absl::Status status;
    if (node->sent) {
      const uint8_t* data = nullptr;
      size_t size;
      status = AwaitReply(node, &data, &size);
    }
    // A wait that gave up on either side: the node is not serving the step.
    absl::Status local = node->link ? node->link->TakeStepStatus() : absl::OkStatus();
    if (local.ok()) local = std::exchange(node->queue_error, absl::OkStatus());
    const bool link_failed = status.ok() && !local.ok();
    if (link_failed) status = local;
    if (link_failed || absl::IsDeadlineExceeded(status)) status = Failed(node, status);
    if (!status.ok() && first_error.ok()) first_error = status;
  }
  step_nodes_.clear();
  return first_error;
}

void RemoteAttention::AbandonDeviceStep() {
  // A memory node aborts a step's waits when the connection it came on closes
  // (AttentionServer::Serve): asking it to end the step instead would wait out its timeout.
  for (Node* node : step_nodes_) {
    node->queue_error = absl::OkStatus();
    Drop(node);
  }
  step_nodes_.clear();
  ++next_tag_;
}

}  // namespace lamina
