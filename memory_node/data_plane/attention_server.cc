#include "memory_node/data_plane/attention_server.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/threading/quiescent_release.h"
#include "common/transport/wire.h"
#include "data_plane/attention_protocol.h"

namespace lamina {

namespace ap = attention_protocol;

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::Start(Transport* transport, const std::string& address,
                                                                       const AttentionWireShape& shape,
                                                                       AttentionService* service, std::mutex* service_mu,
                                                                       AttentionExecutor* executor) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener, transport->Listen(address));
  std::unique_ptr<AttentionServer> server(
      new AttentionServer(std::move(listener), shape, service, service_mu, executor));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

AttentionServer::~AttentionServer() {
  stopping_ = true;
  listener_->Close();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::lock_guard<std::mutex> lock(connections_mu_);
  for (Served& served : connections_) served.connection->Close();
  for (Served& served : connections_) served.thread.join();
}

void AttentionServer::AcceptLoop() {
  while (!stopping_) {
    // At least once a second, so that the connections that ended are reaped promptly even when no
    // new one comes.
    auto connection = listener_->Accept(absl::Now() + absl::Seconds(1));
    std::lock_guard<std::mutex> lock(connections_mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      it->thread.join();
      it = connections_.erase(it);  // closes its descriptor
    }
    if (!connection.ok()) {
      if (stopping_ || absl::IsCancelled(connection.status())) return;
      continue;
    }
    if (connections_.size() >= kMostConnections) {
      std::fprintf(stderr, "data plane: refusing %s: %zu connections already open\n",
                   (*connection)->peer().c_str(), connections_.size());
      continue;  // the connection closes as it goes out of scope
    }
    Served& served = connections_.emplace_back();
    served.connection = std::move(*connection);
    served.thread = std::thread([this, &served] {
      Serve(served.connection.get());
      served.done = true;
    });
  }
}

void AttentionServer::Serve(Connection* connection) {
  Scratch s;
  s.q_size = shape_.q_size;
  s.kv_size = shape_.kv_size;
  MessageHeader header;
  while (!stopping_) {
    if (!connection->Receive(&header, &s.request, absl::InfiniteFuture()).ok()) {
      // The compute node is gone (or the server stops): a step it left queued here would hold its
      // waits, and the SMs of a linked attention's, until the link's timeout.
      if (s.step_open) {
        const absl::Status aborted = AbortStep(&s);
        std::fprintf(stderr, "compute node at %s closed its connection mid-step: the step's waits ended %s%s\n",
                     connection->peer().c_str(), aborted.ok() ? "at once" : "at their timeout, as the abort failed: ",
                     aborted.ok() ? "" : aborted.ToString().c_str());
      }
      RetireLink(&s);
      return;
    }
    s.out.clear();
    s.answer.clear();
    absl::Status status;
    {
      // Ending a device step only waits for it; the lane measures the step's device time.
      ScopedBusy timed(header.type == ap::kEndDecode ? nullptr : &busy_);
      status = Handle(header.type, &s);
    }
    s.reply.clear();
    WireWriter w(&s.reply);
    w.Put<int32_t>(static_cast<int32_t>(status.code()));
    w.PutString(std::string(status.message()));
    if (header.type == ap::kOpenLink && status.ok()) w.PutString(s.answer);
    ByteSpan parts[] = {s.reply, ByteSpan(reinterpret_cast<const uint8_t*>(s.out.data()), s.out.size() * sizeof(float))};
    if (!connection->Send({ap::kReply, 0, header.tag}, parts).ok()) {
      AbortStep(&s).IgnoreError();
      RetireLink(&s);
      return;
    }
    if (s.begun.pending) {
      // After the reply: the compute node starts sending while the layers are queued.
      s.begun.pending = false;
      if (!s.step_open) QuiescentRelease::Process().BeginStep();  // one for a step begun over an open one
      s.step_open = true;
      MemoryLinkEnd* link = s.link.get();
      s.queueing_watch.Arm({{"compute node at " + connection->peer(), connection, [link] { return link->Abort(); }}});
      s.queued = s.begun.transfers.empty()
                     ? AttentionExecutor::QueueDeviceDecode(s.begun.step, executor_->options(), s.begun.rows,
                                                            s.begun.chunks, s.begun.layers, s.begun.linked,
                                                            s.lane.get(), s.link.get())
                     : AttentionExecutor::QueueDeviceStore(s.begun.step, executor_->options(), s.begun.transfers,
                                                           s.begun.layers, s.lane.get(), s.link.get());
      s.queueing_watch.Disarm();
    }
  }
}

namespace {

// A count read off the wire must fit in what is left of the message, so that a malformed one
// cannot make the server allocate without bound.
absl::Status CheckCount(uint32_t n, size_t bytes_each, const WireReader& r) {
  if (n > r.remaining() / bytes_each) {
    return absl::InvalidArgumentError(absl::StrCat("message claims ", n, " entries; only ", r.remaining(), " bytes follow"));
  }
  return absl::OkStatus();
}

// `n` decode entries (i64 seq, i32 position), after CheckCount.
absl::Status ReadEntries(uint32_t n, WireReader* r, std::vector<DecodeEntry>* entries) {
  entries->resize(n);
  for (DecodeEntry& e : *entries) {
    LAMINA_RETURN_IF_ERROR(r->Get(&e.seq));
    LAMINA_RETURN_IF_ERROR(r->Get(&e.position));
  }
  return absl::OkStatus();
}

// A step's layer list (u32 m, m x i32 layer): distinct, ascending, each below `num_layers`.
absl::Status ReadLayers(int64_t num_layers, WireReader* r, std::vector<int64_t>* layers) {
  uint32_t m;
  LAMINA_RETURN_IF_ERROR(r->Get(&m));
  LAMINA_RETURN_IF_ERROR(CheckCount(m, sizeof(int32_t), *r));
  layers->clear();
  for (uint32_t i = 0; i < m; ++i) {
    int32_t layer;
    LAMINA_RETURN_IF_ERROR(r->Get(&layer));
    if (layer < 0 || layer >= num_layers || (!layers->empty() && layer <= layers->back())) {
      return absl::InvalidArgumentError(absl::StrCat("a step lists layer ", layer, " after ",
                                                     layers->empty() ? -1 : layers->back(), " (of ", num_layers,
                                                     "): layers must ascend and exist"));
    }
    layers->push_back(layer);
  }
  if (layers->empty()) return absl::InvalidArgumentError("a step lists no layers");
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionServer::Handle(uint32_t type, Scratch* scratch) {
  WireReader r(scratch->request.data(), scratch->request.size());
  std::vector<float>* out = &scratch->out;
  switch (type) {
    case ap::kReserve: {
      uint32_t n;
      LAMINA_RETURN_IF_ERROR(r.Get(&n));
      LAMINA_RETURN_IF_ERROR(CheckCount(n, sizeof(int64_t) + sizeof(int32_t), r));
      std::vector<Reservation>& reservations = scratch->reservations;
      reservations.resize(n);
      for (Reservation& res : reservations) {
        LAMINA_RETURN_IF_ERROR(r.Get(&res.seq));
        LAMINA_RETURN_IF_ERROR(r.Get(&res.end_position));
      }
      std::lock_guard<std::mutex> lock(*service_mu_);
      return service_->Reserve(reservations);
    }
    case ap::kStoreKv: {
      int64_t layer, seq, count;
      int32_t first;
      LAMINA_RETURN_IF_ERROR(r.Get(&layer));
      LAMINA_RETURN_IF_ERROR(r.Get(&seq));
      LAMINA_RETURN_IF_ERROR(r.Get(&first));
      LAMINA_RETURN_IF_ERROR(r.Get(&count));
      if (count < 0 || count > (int64_t{1} << 24)) return absl::InvalidArgumentError("bad token count");
      const uint8_t *k = nullptr, *v = nullptr;
      const size_t bytes = static_cast<size_t>(count * scratch->kv_size) * sizeof(float);
      LAMINA_RETURN_IF_ERROR(r.GetBytes(bytes, &k));
      LAMINA_RETURN_IF_ERROR(r.GetBytes(bytes, &v));
      const auto* keys = reinterpret_cast<const float*>(k);
      const auto* values = reinterpret_cast<const float*>(v);
      std::lock_guard<std::mutex> lock(*service_mu_);
      if (scratch->windowed) {
        return executor_->StoreKvHeads(scratch->heads, layer, seq, first, count, keys, values, scratch->kv_size);
      }
      return service_->StoreKv(layer, seq, first, count, keys, values, shape_.kv_size);
    }
    case ap::kDecode: {
      int64_t layer;
      uint32_t n;
      LAMINA_RETURN_IF_ERROR(r.Get(&layer));
      LAMINA_RETURN_IF_ERROR(r.Get(&n));
      LAMINA_RETURN_IF_ERROR(CheckCount(n, sizeof(int64_t) + sizeof(int32_t), r));
      std::vector<DecodeEntry>& entries = scratch->entries;
      LAMINA_RETURN_IF_ERROR(ReadEntries(n, &r, &entries));
      const int64_t q = scratch->q_size, kv = scratch->kv_size, row = q + 2 * kv;
      const uint8_t* qkv = nullptr;
      LAMINA_RETURN_IF_ERROR(r.GetBytes(static_cast<size_t>(n * row) * sizeof(float), &qkv));
      out->resize(static_cast<size_t>(n * q));
      const auto* rows = reinterpret_cast<const float*>(qkv);
      const QkvLayout layout{row, 0, q, q + kv};
      std::lock_guard<std::mutex> lock(*service_mu_);
      ScopedBusy timed(&decode_busy_);
      attended_rows_.fetch_add(n, std::memory_order_relaxed);
      absl::Status status = scratch->windowed
                                ? executor_->DecodeHeads(scratch->heads, layer, entries, rows, layout, out->data(), q)
                                : service_->Decode(layer, entries, rows, layout, out->data(), q);
      if (!status.ok()) out->clear();
      return status;
    }
    case ap::kFree: {
      uint32_t n;
      LAMINA_RETURN_IF_ERROR(r.Get(&n));
      LAMINA_RETURN_IF_ERROR(CheckCount(n, sizeof(int64_t), r));
      std::vector<SequenceId>& seqs = scratch->seqs;
      seqs.resize(n);
      for (SequenceId& s : seqs) LAMINA_RETURN_IF_ERROR(r.Get(&s));
      std::lock_guard<std::mutex> lock(*service_mu_);
      for (SequenceId s : seqs) service_->Free(s);
      return absl::OkStatus();
    }
    case ap::kSelectHeads:
      return SelectHeads(&r, scratch);
    case ap::kOpenLink:
    case ap::kBeginDecode:
    case ap::kBeginStore:
    case ap::kEndDecode:
      return HandleLink(type, &r, scratch);
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown data-plane message type ", type));
  }
}

absl::Status AttentionServer::SelectHeads(WireReader* r, Scratch* scratch) {
  int64_t first, count;
  LAMINA_RETURN_IF_ERROR(r->Get(&first));
  LAMINA_RETURN_IF_ERROR(r->Get(&count));
  if (executor_ == nullptr) return absl::FailedPreconditionError("this data plane serves whole heads only");
  if (scratch->link) {
    return absl::FailedPreconditionError("a device link is open on this connection: it carries whole heads only");
  }
  if (shape_.num_kv_heads != executor_->options().attention.num_kv_heads) {
    return absl::FailedPreconditionError("this data plane was started without the model's kv heads");
  }
  const KvHeadWindow heads{first, count};
  LAMINA_RETURN_IF_ERROR(executor_->CheckHeadWindow(heads));
  const int64_t head_dim = shape_.kv_size / shape_.num_kv_heads;
  const int64_t group = shape_.q_size / shape_.kv_size;
  scratch->windowed = true;
  scratch->heads = heads;
  scratch->kv_size = count * head_dim;
  scratch->q_size = count * group * head_dim;
  return absl::OkStatus();
}

absl::Status AttentionServer::HandleLink(uint32_t type, WireReader* r, Scratch* scratch) {
  if (executor_ == nullptr || executor_->device() < 0) {
    return absl::FailedPreconditionError("this memory node keeps its KV cache on the CPU: no device-side data plane");
  }
  if (scratch->windowed) {
    return absl::FailedPreconditionError("this connection carries a share of the heads (kSelectHeads): host path only");
  }
  switch (type) {
    case ap::kOpenLink: {
      std::string transport, offer;
      int64_t max_rows;
      int32_t max_chunks;
      LAMINA_RETURN_IF_ERROR(r->GetString(&transport));
      LAMINA_RETURN_IF_ERROR(r->Get(&max_rows));
      LAMINA_RETURN_IF_ERROR(r->Get(&max_chunks));
      LAMINA_RETURN_IF_ERROR(r->GetString(&offer));
      if (max_rows < 1 || max_rows > (int64_t{1} << 20) || max_chunks < 1 || max_chunks > 64) {
        return absl::InvalidArgumentError(absl::StrCat("a link of ", max_rows, " rows in ", max_chunks, " chunks"));
      }
      LinkShape link{shape_.num_layers, shape_.q_size + 2 * shape_.kv_size, shape_.q_size, max_rows, max_chunks};
      AbortStep(scratch).IgnoreError();
      RetireLink(scratch);
      std::lock_guard<std::mutex> lock(*service_mu_);
      LAMINA_ASSIGN_OR_RETURN(scratch->lane, executor_->NewDeviceLane(max_chunks));
      LAMINA_ASSIGN_OR_RETURN(auto end_and_answer, CreateMemoryLinkEnd(transport, link, executor_->device(), offer));
      scratch->link = std::move(end_and_answer.first);
      scratch->answer = std::move(end_and_answer.second);
      scratch->link_rows = max_rows;
      scratch->link_chunks = max_chunks;
      return absl::OkStatus();
    }
    case ap::kBeginDecode: {
      if (!scratch->link) return absl::FailedPreconditionError("no device link is open on this connection");
      uint64_t step;
      uint32_t chunks, n;
      LAMINA_RETURN_IF_ERROR(r->Get(&step));
      LAMINA_RETURN_IF_ERROR(r->Get(&chunks));
      LAMINA_RETURN_IF_ERROR(r->Get(&n));
      LAMINA_RETURN_IF_ERROR(CheckCount(n, sizeof(int64_t) + sizeof(int32_t), *r));
      if (n > scratch->link_rows || chunks < 1 || static_cast<int>(chunks) > scratch->link_chunks) {
        return absl::InvalidArgumentError(absl::StrCat("a step of ", n, " rows in ", chunks, " chunks on a link of ",
                                                       scratch->link_rows, " rows in ", scratch->link_chunks));
      }
      std::vector<DecodeEntry>& entries = scratch->entries;
      LAMINA_RETURN_IF_ERROR(ReadEntries(n, r, &entries));
      std::vector<int64_t> layers;
      if (r->remaining() > 0) LAMINA_RETURN_IF_ERROR(ReadLayers(shape_.num_layers, r, &layers));
      std::lock_guard<std::mutex> lock(*service_mu_);
      LAMINA_RETURN_IF_ERROR(executor_->PrepareDeviceDecode(entries, static_cast<int>(chunks), scratch->lane.get()));
      scratch->begun = {true, step, static_cast<int64_t>(n), static_cast<int>(chunks), {}, std::move(layers),
                        AttentionExecutor::MayLink(entries)};
      return absl::OkStatus();
    }
    case ap::kBeginStore: {
      if (!scratch->link) return absl::FailedPreconditionError("no device link is open on this connection");
      uint64_t step;
      uint32_t n;
      LAMINA_RETURN_IF_ERROR(r->Get(&step));
      LAMINA_RETURN_IF_ERROR(r->Get(&n));
      LAMINA_RETURN_IF_ERROR(
          CheckCount(n, sizeof(int64_t) + sizeof(int32_t) + sizeof(int64_t) + sizeof(uint32_t), *r));
      std::vector<AttentionExecutor::StorePiece> pieces(n);
      for (AttentionExecutor::StorePiece& piece : pieces) {
        uint32_t transfer;
        LAMINA_RETURN_IF_ERROR(r->Get(&piece.seq));
        LAMINA_RETURN_IF_ERROR(r->Get(&piece.first_position));
        LAMINA_RETURN_IF_ERROR(r->Get(&piece.count));
        LAMINA_RETURN_IF_ERROR(r->Get(&transfer));
        if (piece.count < 1 || piece.count > (int64_t{1} << 30)) {
          return absl::InvalidArgumentError(absl::StrCat("a store piece of ", piece.count, " rows"));
        }
        piece.transfer = static_cast<int32_t>(std::min<uint32_t>(transfer, 1u << 30));
      }
      LAMINA_ASSIGN_OR_RETURN(std::vector<int64_t> transfers, AttentionExecutor::TransferRows(pieces));
      const int64_t most = ap::StoreTransferRows(scratch->link_rows, shape_.q_size, shape_.kv_size);
      for (size_t t = 0; t < transfers.size(); ++t) {
        if (transfers[t] > most) {
          return absl::InvalidArgumentError(absl::StrCat("store transfer ", t, " of ", transfers[t],
                                                         " rows on a link of ", scratch->link_rows, " (", most,
                                                         " rows of k/v)"));
        }
      }
      std::vector<int64_t> layers;
      if (r->remaining() > 0) LAMINA_RETURN_IF_ERROR(ReadLayers(shape_.num_layers, r, &layers));
      std::lock_guard<std::mutex> lock(*service_mu_);
      LAMINA_RETURN_IF_ERROR(executor_->PrepareDeviceStore(pieces, scratch->lane.get()));
      scratch->begun = {true, step, 0, 1, std::move(transfers), std::move(layers)};
      return absl::OkStatus();
    }
    default: {  // kEndDecode
      if (!scratch->link) return absl::FailedPreconditionError("no device link is open on this connection");
      // The lane is this connection's own: no lock while its step runs.
      absl::Status finished = EndStep(scratch);
      absl::StatusOr<absl::Duration> device_busy = scratch->lane->TakeBusy();
      if (device_busy.ok()) busy_.Add(*device_busy);
      if (finished.ok()) finished = device_busy.status();
      absl::Status queued = std::exchange(scratch->queued, absl::OkStatus());
      return queued.ok() ? finished : queued;
    }
  }
}

absl::Status AttentionServer::EndStep(Scratch* scratch) {
  absl::Status finished = AttentionExecutor::FinishDeviceDecode(scratch->lane.get(), scratch->link.get());
  if (scratch->step_open) {
    scratch->step_open = false;
    QuiescentRelease::Process().EndStep();
  }
  return finished;
}

absl::Status AttentionServer::AbortStep(Scratch* scratch) {
  if (!scratch->step_open) return absl::OkStatus();
  absl::Status aborted = scratch->link->Abort();
  EndStep(scratch).IgnoreError();
  return aborted;
}

void AttentionServer::RetireLink(Scratch* scratch) {
  QuiescentRelease::Process().Retire(std::move(scratch->link));
  QuiescentRelease::Process().Retire(std::move(scratch->lane));
}

}  // namespace lamina
