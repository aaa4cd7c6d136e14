#include "kv/attention/attention_executor.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "data_plane/attention_protocol.h"

namespace lamina {
namespace {

// A device step's layers: `layers` itself, or, when it is empty, every layer (kept in `every`).
absl::Span<const int64_t> StepLayers(const AttentionExecutorOptions& options, absl::Span<const int64_t> layers,
                                     std::vector<int64_t>* every) {
  if (!layers.empty()) return layers;
  for (int64_t layer = 0; layer < options.num_layers; ++layer) every->push_back(layer);
  return *every;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionExecutor>> AttentionExecutor::Create(
    const AttentionExecutorOptions& options, ThreadPool* pool) {
  const auto& a = options.attention;
  if (a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0) {
    return absl::InvalidArgumentError("attention heads: num_q_heads must be a multiple of num_kv_heads");
  }
  if (options.num_layers <= 0 || options.num_slots <= 0) {
    return absl::InvalidArgumentError("KV pool needs at least one layer and one slot");
  }
  const KvBackendOptions backend_options{options.num_layers, options.num_slots, a, options.kv_dtype};
  std::unique_ptr<KvBackend> backend;
  if (options.cuda_device >= 0) {
    LAMINA_ASSIGN_OR_RETURN(backend, CreateCudaKvBackend(backend_options, options.cuda_device));
  } else {
    LAMINA_ASSIGN_OR_RETURN(backend, CreateCpuKvBackend(backend_options, pool));
  }
  return std::unique_ptr<AttentionExecutor>(new AttentionExecutor(options, std::move(backend)));
}

absl::StatusOr<const std::vector<SlotId>*> AttentionExecutor::SlotsOf(SequenceId seq) const {
  auto it = slots_.find(seq);
  if (it == slots_.end()) return absl::InvalidArgumentError(absl::StrCat("unknown sequence ", seq));
  return &it->second;
}

int64_t AttentionExecutor::SlotsNeeded(absl::Span<const Reservation> reservations) const {
  // A sequence may appear more than once; the largest end position counts.
  absl::flat_hash_map<SequenceId, int32_t> ends;
  for (const Reservation& r : reservations) ends[r.seq] = std::max(ends[r.seq], r.end_position);
  int64_t needed = 0;
  for (const auto& [seq, end] : ends) {
    auto it = slots_.find(seq);
    const int64_t held = it == slots_.end() ? 0 : static_cast<int64_t>(it->second.size());
    needed += std::max<int64_t>(0, end - held);
  }
  return needed;
}

absl::Status AttentionExecutor::Reserve(absl::Span<const Reservation> reservations) {
  for (const Reservation& r : reservations) {
    if (r.end_position < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", r.seq, ": negative position ", r.end_position));
    }
  }
  const int64_t needed = SlotsNeeded(reservations);
  if (needed > allocator_.num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool has ", allocator_.num_free(), " free slots of ",
                                                     allocator_.num_slots(), "; ", needed, " needed"));
  }
  for (const Reservation& r : reservations) {
    std::vector<SlotId>& slots = slots_[r.seq];
    const int64_t missing = r.end_position - static_cast<int64_t>(slots.size());
    if (missing > 0) LAMINA_CHECK(allocator_.Allocate(missing, &slots).ok());  // checked above
  }
  return absl::OkStatus();
}

absl::Status AttentionExecutor::StoreKv(int64_t layer, SequenceId seq, int32_t first_position,
                                        int64_t count, const float* k, const float* v, int64_t row_stride) {
  return StoreKvHeads({0, options_.attention.num_kv_heads}, layer, seq, first_position, count, k, v, row_stride);
}

absl::Status AttentionExecutor::CheckHeadWindow(const KvHeadWindow& heads) const {
  const int64_t all = options_.attention.num_kv_heads;
  if (heads.first < 0 || heads.count < 1 || heads.first + heads.count > all) {
    return absl::InvalidArgumentError(absl::StrCat("kv heads [", heads.first, ", ", heads.first + heads.count,
                                                   ") are not a window of the pool's ", all));
  }
  // Checked here, before anything is written: a call that fails changes nothing.
  if (!IsWhole(heads) && (options_.cuda_device >= 0 || options_.kv_dtype == DType::kF8E4M3)) {
    return absl::UnimplementedError(absl::StrCat(
        "a tensor-parallel rank's share of the kv heads needs a KV pool on the CPU in bfloat16 or float32; this one is ",
        options_.cuda_device >= 0 ? "on a GPU" : "float8"));
  }
  return absl::OkStatus();
}

absl::Status AttentionExecutor::StoreKvHeads(const KvHeadWindow& heads, int64_t layer, SequenceId seq,
                                             int32_t first_position, int64_t count, const float* k, const float* v,
                                             int64_t row_stride) {
  LAMINA_RETURN_IF_ERROR(CheckHeadWindow(heads));
  LAMINA_ASSIGN_OR_RETURN(const std::vector<SlotId>* slots, SlotsOf(seq));
  if (layer < 0 || layer >= options_.num_layers) return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  if (first_position < 0 || first_position + count > static_cast<int64_t>(slots->size())) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, ": positions [", first_position, ", ",
                                                   first_position + count, ") are not reserved"));
  }
  LAMINA_RETURN_IF_ERROR(CheckWritable(seq, *slots, first_position, count));
  write_slots_.assign(slots->begin() + first_position, slots->begin() + first_position + count);
  if (IsWhole(heads)) return backend_->Store(layer, write_slots_, k, v, row_stride);
  return backend_->StoreHeads(heads, layer, write_slots_, k, v, row_stride);
}

absl::Status AttentionExecutor::CheckWritable(SequenceId seq, const std::vector<SlotId>& slots, int64_t first,
                                              int64_t count) const {
  for (int64_t t = first; t < first + count; ++t) {
    if (allocator_.RefCount(slots[t]) > 1) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": position ", t,
                                                        " is shared with another sequence and cannot be written"));
    }
  }
  return absl::OkStatus();
}

void AttentionExecutor::GatherContexts(absl::Span<const DecodeEntry> entries, std::vector<int32_t>* slot_ids,
                                       std::vector<int64_t>* slot_begin) const {
  slot_ids->clear();
  slot_begin->assign(1, 0);
  for (const DecodeEntry& e : entries) {
    const std::vector<SlotId>& slots = slots_.find(e.seq)->second;
    slot_ids->insert(slot_ids->end(), slots.begin(), slots.begin() + e.position + 1);
    slot_begin->push_back(static_cast<int64_t>(slot_ids->size()));
  }
}

absl::Status AttentionExecutor::CheckDecode(int64_t layer, absl::Span<const DecodeEntry> entries) {
  // Validate everything first so that a bad entry changes nothing.
  if (layer < 0 || layer >= options_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  for (const DecodeEntry& e : entries) {
    LAMINA_ASSIGN_OR_RETURN(const std::vector<SlotId>* slots, SlotsOf(e.seq));
    if (e.position < 0 || e.position >= static_cast<int64_t>(slots->size())) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", e.seq, ": position ", e.position,
                                                     " is not reserved"));
    }
  }
  write_slots_.clear();
  for (const DecodeEntry& e : entries) {
    const std::vector<SlotId>& slots = slots_.find(e.seq)->second;
    LAMINA_RETURN_IF_ERROR(CheckWritable(e.seq, slots, e.position, 1));
    write_slots_.push_back(slots[e.position]);
  }
  return absl::OkStatus();
}

absl::Status AttentionExecutor::PrepareDeviceDecode(absl::Span<const DecodeEntry> entries, int chunks,
                                                    DeviceKvLane* kv) {
  if (chunks < 1) return absl::InvalidArgumentError(absl::StrCat(chunks, " chunks"));
  LAMINA_RETURN_IF_ERROR(CheckDecode(0, entries));
  GatherContexts(entries, &device_slot_ids_, &device_slot_begin_);
  return kv->SetStep(write_slots_, device_slot_ids_, device_slot_begin_, chunks);
}

bool AttentionExecutor::MayLink(absl::Span<const DecodeEntry> entries) {
  absl::flat_hash_set<SequenceId> seen;
  for (const DecodeEntry& e : entries) {
    if (!seen.insert(e.seq).second) return false;
  }
  return true;
}

absl::Status AttentionExecutor::QueueDeviceDecode(uint64_t step, const AttentionExecutorOptions& options,
                                                  int64_t rows, int chunks, absl::Span<const int64_t> layers,
                                                  bool linked, DeviceKvLane* kv, MemoryLinkEnd* link) {
  const int64_t q = options.attention.num_q_heads * options.attention.head_dim;
  const int64_t kv_size = options.attention.num_kv_heads * options.attention.head_dim;
  const QkvLayout layout{q + 2 * kv_size, 0, q, q + kv_size};
  std::vector<int64_t> every_layer;
  layers = StepLayers(options, layers, &every_layer);
  link->SetStepLayers(layers.front(), layers.back());
  for (const int64_t layer : layers) {
    for (int c = 0; c < chunks; ++c) {
      // One launch for the chunk where the link lets the attention move the rows itself.
      const std::optional<DeviceHop> hop =
          linked ? link->DirectHop(step, layer, c, chunks, rows) : std::optional<DeviceHop>();
      if (hop.has_value() && ChunkOf(rows, chunks, c).count > 0) {
        LAMINA_RETURN_IF_ERROR(kv->QueueLinkedChunk(layer, c, link->received(), layout, *hop));
        continue;
      }
      LAMINA_RETURN_IF_ERROR(link->QueueReceive(step, layer, c, chunks, rows, kv->stream()));
      LAMINA_RETURN_IF_ERROR(kv->QueueChunk(layer, c, link->received(), layout));
      LAMINA_RETURN_IF_ERROR(link->QueueSend(step, layer, c, chunks, rows, kv->step_out(), q, kv->stream()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> AttentionExecutor::TransferRows(absl::Span<const StorePiece> pieces) {
  std::vector<int64_t> rows;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int32_t t = pieces[i].transfer;
    const int32_t expected = static_cast<int32_t>(rows.size());  // a new transfer's number
    if (t == expected) {
      rows.push_back(0);
    } else if (rows.empty() || t != expected - 1) {
      return absl::InvalidArgumentError(absl::StrCat("store piece ", i, " (sequence ", pieces[i].seq,
                                                     ") is in transfer ", t, ", after transfer ", expected - 1,
                                                     ": transfers must count up from 0, one at a time"));
    }
    rows.back() += pieces[i].count;
  }
  return rows;
}

absl::Status AttentionExecutor::PrepareDeviceStore(absl::Span<const StorePiece> pieces, DeviceKvLane* lane) {
  std::vector<int32_t> slots;
  LAMINA_RETURN_IF_ERROR(StoreSlots(pieces, &slots));
  return lane->SetStoreSlots(slots);
}

absl::Status AttentionExecutor::PrepareLocalStep(absl::Span<const DecodeEntry> entries, int64_t padded_rows,
                                                 LocalKvStep* step, CUstream_st* stream) {
  LAMINA_RETURN_IF_ERROR(CheckDecode(0, entries));
  GatherContexts(entries, &device_slot_ids_, &device_slot_begin_);
  return step->SetStep(write_slots_, device_slot_ids_, device_slot_begin_, padded_rows, !MayLink(entries), stream);
}

absl::Status AttentionExecutor::PrepareLocalStore(absl::Span<const StorePiece> pieces, LocalKvStep* step,
                                                  CUstream_st* stream) {
  std::vector<int32_t> slots;
  LAMINA_RETURN_IF_ERROR(StoreSlots(pieces, &slots));
  return step->SetStoreSlots(slots, stream);
}

absl::Status AttentionExecutor::StoreSlots(absl::Span<const StorePiece> pieces, std::vector<int32_t>* slots) const {
  slots->clear();
  for (const StorePiece& piece : pieces) {
    LAMINA_ASSIGN_OR_RETURN(const std::vector<SlotId>* seq_slots, SlotsOf(piece.seq));
    if (piece.count < 1 || piece.first_position < 0 ||
        piece.first_position + piece.count > static_cast<int64_t>(seq_slots->size())) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", piece.seq, ": positions [", piece.first_position,
                                                     ", ", piece.first_position + piece.count, ") are not reserved"));
    }
    LAMINA_RETURN_IF_ERROR(CheckWritable(piece.seq, *seq_slots, piece.first_position, piece.count));
    slots->insert(slots->end(), seq_slots->begin() + piece.first_position,
                  seq_slots->begin() + piece.first_position + piece.count);
  }
  return absl::OkStatus();
}

absl::Status AttentionExecutor::QueueDeviceStore(uint64_t step, const AttentionExecutorOptions& options,
                                                 absl::Span<const int64_t> transfers,
                                                 absl::Span<const int64_t> layers, DeviceKvLane* lane,
                                                 MemoryLinkEnd* link) {
  const int64_t q = options.attention.num_q_heads * options.attention.head_dim;
  const int64_t kv_size = options.attention.num_kv_heads * options.attention.head_dim;
  // A store's transfers arrive as [rows, k | v]; their slots are the pieces', back to back.
  const QkvLayout layout{2 * kv_size, 0, 0, kv_size};
  std::vector<int64_t> every_layer;
  layers = StepLayers(options, layers, &every_layer);
  link->SetStepLayers(layers.front(), layers.back());
  for (const int64_t layer : layers) {
    int64_t first_slot = 0;
    for (size_t i = 0; i < transfers.size(); ++i) {
      const uint64_t transfer_step = attention_protocol::StoreTransferStep(step, layer, transfers.size(), i);
      LAMINA_RETURN_IF_ERROR(link->QueueReceiveStore(transfer_step, layer, transfers[i], lane->stream()));
      LAMINA_RETURN_IF_ERROR(lane->QueueStore(layer, first_slot, transfers[i], link->received(), layout));
      LAMINA_RETURN_IF_ERROR(link->QueueSend(transfer_step, layer, 0, 1, 0, lane->step_out(), q, lane->stream()));
      first_slot += transfers[i];
    }
  }
  return absl::OkStatus();
}

absl::Status AttentionExecutor::FinishDeviceDecode(DeviceKvLane* kv, MemoryLinkEnd* link) {
  LAMINA_RETURN_IF_ERROR(kv->Synchronize());
  return link->TakeStepStatus();
}

absl::Status AttentionExecutor::Decode(int64_t layer, absl::Span<const DecodeEntry> entries,
                                       const float* qkv, const QkvLayout& layout, float* out,
                                       int64_t out_stride) {
  return DecodeHeads({0, options_.attention.num_kv_heads}, layer, entries, qkv, layout, out, out_stride);
}

absl::Status AttentionExecutor::DecodeHeads(const KvHeadWindow& heads, int64_t layer,
                                            absl::Span<const DecodeEntry> entries, const float* qkv,
                                            const QkvLayout& layout, float* out, int64_t out_stride) {
  LAMINA_RETURN_IF_ERROR(CheckHeadWindow(heads));
  LAMINA_RETURN_IF_ERROR(CheckDecode(layer, entries));
  const bool whole = IsWhole(heads);
  LAMINA_RETURN_IF_ERROR(whole ? backend_->Store(layer, write_slots_, qkv + layout.k_offset, qkv + layout.v_offset,
                                                 layout.row_stride)
                               : backend_->StoreHeads(heads, layer, write_slots_, qkv + layout.k_offset,
                                                      qkv + layout.v_offset, layout.row_stride));
  // Every layer of a step attends over the same slots: gather them once per step.
  const bool same_step = entries.size() == gathered_for_.size() &&
                         std::equal(entries.begin(), entries.end(), gathered_for_.begin(),
                                    [](const DecodeEntry& a, const DecodeEntry& b) {
                                      return a.seq == b.seq && a.position == b.position;
                                    });
  if (!same_step) {
    GatherContexts(entries, &gathered_slots_, &slot_begin_);
    gathered_for_.clear();  // stays empty if the backend refuses the lists
    LAMINA_RETURN_IF_ERROR(backend_->SetContexts(gathered_slots_, slot_begin_));
    gathered_for_.assign(entries.begin(), entries.end());
  }
  if (whole) return backend_->Attend(layer, qkv + layout.q_offset, layout.row_stride, out, out_stride);
  return backend_->AttendHeads(heads, layer, qkv + layout.q_offset, layout.row_stride, out, out_stride);
}

absl::Status AttentionExecutor::Fork(SequenceId from, SequenceId to, int64_t length) {
  LAMINA_ASSIGN_OR_RETURN(const std::vector<SlotId>* source, SlotsOf(from));
  if (slots_.count(to)) return absl::InvalidArgumentError(absl::StrCat("sequence ", to, " already exists"));
  const int64_t n = length < 0 ? static_cast<int64_t>(source->size()) : length;
  if (n > static_cast<int64_t>(source->size())) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", from, " has ", source->size(), " positions, not ", n));
  }
  // The new sequence shares the slots (their KV is written once); it grows into slots of its own.
  std::vector<SlotId> shared(source->begin(), source->begin() + n);
  allocator_.Share(shared);
  slots_[to] = std::move(shared);
  return absl::OkStatus();
}

void AttentionExecutor::Free(SequenceId seq) {
  auto it = slots_.find(seq);
  if (it == slots_.end()) return;
  gathered_for_.clear();  // the freed slots may be handed to another sequence
  allocator_.Release(it->second);
  slots_.erase(it);
}

void AttentionExecutor::FreeAll() {
  gathered_for_.clear();
  for (auto& [seq, slots] : slots_) allocator_.Release(slots);
  slots_.clear();
}

}  // namespace lamina
