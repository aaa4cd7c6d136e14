#include "compute_node/local/placed_attention.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<PlacedAttention>> PlacedAttention::Create(LocalPool* local, std::string local_name,
                                                                         RemoteAttention* remote) {
  if (local == nullptr && remote == nullptr) {
    return absl::InvalidArgumentError("a compute node needs a KV pool of its own or memory nodes");
  }
  std::unique_ptr<PlacedAttention> placed(new PlacedAttention(local, std::move(local_name), remote));
  if (local != nullptr && local->device() >= 0) {
    LAMINA_ASSIGN_OR_RETURN(placed->step_, local->With([](AttentionExecutor& e) { return e.NewLocalStep(); }));
  }
  return placed;
}

absl::Status PlacedAttention::Assign(SequenceId seq, const std::string& node) {
  if (local_ != nullptr && node == local_name_) {
    remote_seqs_.erase(seq);
    return absl::OkStatus();
  }
  if (remote_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " is placed on '", node,
                                                   "', which is neither this compute node's pool ('", local_name_,
                                                   "') nor a memory node"));
  }
  LAMINA_RETURN_IF_ERROR(remote_->Assign(seq, node));
  remote_seqs_.insert(seq);
  return absl::OkStatus();
}

void PlacedAttention::Forget(SequenceId seq) {
  remote_seqs_.erase(seq);
  if (remote_ != nullptr) remote_->Forget(seq);
}

std::vector<RemoteAttention::FailedNode> PlacedAttention::TakeFailedNodes() {
  return remote_ != nullptr ? remote_->TakeFailedNodes() : std::vector<RemoteAttention::FailedNode>{};
}

absl::Status PlacedAttention::Reserve(absl::Span<const Reservation> reservations) {
  std::vector<Reservation> here, there;
  for (const Reservation& r : reservations) (IsLocal(r.seq) ? here : there).push_back(r);
  // The memory nodes first: only they can fail for reasons beyond the coordinator's accounting.
  if (!there.empty()) LAMINA_RETURN_IF_ERROR(remote_->Reserve(there));
  if (here.empty()) return absl::OkStatus();
  return local_->With([&](AttentionExecutor& e) { return e.Reserve(here); });
}

absl::Status PlacedAttention::StoreKv(int64_t layer, SequenceId seq, int32_t first_position, int64_t count,
                                      const float* k, const float* v, int64_t row_stride) {
  if (!IsLocal(seq)) return remote_->StoreKv(layer, seq, first_position, count, k, v, row_stride);
  return local_->With(
      [&](AttentionExecutor& e) { return e.StoreKv(Local(layer), seq, first_position, count, k, v, row_stride); });
}

absl::Status PlacedAttention::FlushStores() { return remote_ != nullptr ? remote_->FlushStores() : absl::OkStatus(); }

absl::Status PlacedAttention::Decode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv,
                                     const QkvLayout& layout, float* out, int64_t out_stride) {
  local_rows_.clear();
  remote_rows_.clear();
  for (size_t i = 0; i < entries.size(); ++i) (IsLocal(entries[i].seq) ? local_rows_ : remote_rows_).push_back(i);
  if (remote_rows_.empty()) {
    return local_->With(
        [&](AttentionExecutor& e) { return e.Decode(Local(layer), entries, qkv, layout, out, out_stride); });
  }
  if (local_rows_.empty()) return remote_->Decode(layer, entries, qkv, layout, out, out_stride);
  // The remote rows leave first; the local ones are attended while the memory nodes work on theirs.
  Gather(entries, remote_rows_, qkv, layout, &remote_part_);
  const absl::Status sent = remote_->SendDecode(layer, remote_part_.entries, remote_part_.qkv.data(), layout);
  Gather(entries, local_rows_, qkv, layout, &local_part_);
  local_part_.out.resize(local_rows_.size() * out_stride);
  const absl::Status local = local_->With([&](AttentionExecutor& e) {
    return e.Decode(Local(layer), local_part_.entries, local_part_.qkv.data(), layout, local_part_.out.data(),
                    out_stride);
  });
  remote_part_.out.resize(remote_rows_.size() * out_stride);
  const absl::Status gathered = remote_->GatherDecode(remote_part_.out.data(), out_stride);
  LAMINA_RETURN_IF_ERROR(sent);
  LAMINA_RETURN_IF_ERROR(gathered);
  LAMINA_RETURN_IF_ERROR(local);
  Scatter(local_part_, local_rows_, out, out_stride);
  Scatter(remote_part_, remote_rows_, out, out_stride);
  return absl::OkStatus();
}

void PlacedAttention::Gather(absl::Span<const DecodeEntry> entries, const std::vector<size_t>& rows, const float* qkv,
                             const QkvLayout& layout, Part* part) {
  part->entries.clear();
  part->qkv.resize(rows.size() * layout.row_stride);
  for (size_t i = 0; i < rows.size(); ++i) {
    part->entries.push_back(entries[rows[i]]);
    std::copy_n(qkv + rows[i] * layout.row_stride, layout.row_stride, part->qkv.data() + i * layout.row_stride);
  }
}

void PlacedAttention::Scatter(const Part& part, const std::vector<size_t>& rows, float* out, int64_t out_stride) {
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(part.out.data() + i * out_stride, out_stride, out + rows[i] * out_stride);
  }
}

void PlacedAttention::Free(SequenceId seq) {
  if (IsLocal(seq)) {
    local_->With([&](AttentionExecutor& e) { e.Free(seq); });
  } else {
    remote_->Free(seq);
  }
}

DeviceDecode* PlacedAttention::device_decode() {
  return remote_ != nullptr && remote_->device_decode() != nullptr ? this : nullptr;
}

bool PlacedAttention::CanDecodeOnDevice(absl::Span<const DecodeEntry> entries, const QkvLayout& layout) {
  for (const DecodeEntry& e : entries) {
    if (IsLocal(e.seq)) return false;
  }
  return remote_->CanDecodeOnDevice(entries, layout);
}

absl::Status PlacedAttention::BeginDeviceDecode(absl::Span<const DecodeEntry> entries,
                                                absl::Span<const int64_t> layers) {
  return remote_->BeginDeviceDecode(entries, layers);
}

absl::Status PlacedAttention::QueueDeviceDecode(int64_t layer, const float* qkv, int64_t qkv_stride, float* out,
                                                int64_t out_stride, CUstream_st* stream) {
  return remote_->QueueDeviceDecode(layer, qkv, qkv_stride, out, out_stride, stream);
}

absl::Status PlacedAttention::EndDeviceDecode() { return remote_->EndDeviceDecode(); }

void PlacedAttention::AbandonDeviceStep() { remote_->AbandonDeviceStep(); }

bool PlacedAttention::CanStoreOnDevice(absl::Span<const PromptRows> prompts) {
  for (const PromptRows& p : prompts) {
    if (IsLocal(p.seq)) return false;
  }
  return remote_->CanStoreOnDevice(prompts);
}

absl::Status PlacedAttention::BeginDeviceStore(absl::Span<const PromptRows> prompts,
                                               absl::Span<const int64_t> layers) {
  return remote_->BeginDeviceStore(prompts, layers);
}

absl::Status PlacedAttention::QueueDeviceStore(int64_t layer, const float* qkv, int64_t qkv_stride,
                                               CUstream_st* stream) {
  return remote_->QueueDeviceStore(layer, qkv, qkv_stride, stream);
}

absl::Status PlacedAttention::EndDeviceStore() { return remote_->EndDeviceStore(); }

bool PlacedAttention::Holds(absl::Span<const DecodeEntry> entries) {
  return std::all_of(entries.begin(), entries.end(), [&](const DecodeEntry& e) { return IsLocal(e.seq); });
}

bool PlacedAttention::HoldsPrompts(absl::Span<const PromptRows> prompts) {
  return std::all_of(prompts.begin(), prompts.end(), [&](const PromptRows& p) { return IsLocal(p.seq); });
}

absl::StatusOr<uint64_t> PlacedAttention::BeginStep(absl::Span<const DecodeEntry> entries, int64_t padded_rows,
                                                    CUstream_st* stream) {
  LAMINA_RETURN_IF_ERROR(local_->With(
      [&](AttentionExecutor& e) { return e.PrepareLocalStep(entries, padded_rows, step_.get(), stream); }));
  return step_->graph_key();
}

absl::Status PlacedAttention::QueueLayer(int64_t layer, const float* qkv, const QkvLayout& layout, float* out,
                                         int64_t out_stride, CUstream_st* stream) {
  return step_->QueueLayer(Local(layer), qkv, layout, out, out_stride, stream);
}

absl::Status PlacedAttention::BeginStore(absl::Span<const PromptRows> prompts, CUstream_st* stream) {
  std::vector<AttentionExecutor::StorePiece> pieces;
  for (const PromptRows& p : prompts) pieces.push_back({p.seq, 0, p.count, 0});
  return local_->With([&](AttentionExecutor& e) { return e.PrepareLocalStore(pieces, step_.get(), stream); });
}

absl::Status PlacedAttention::QueueStore(int64_t layer, const float* qkv, const QkvLayout& layout,
                                         CUstream_st* stream) {
  return step_->QueueStore(Local(layer), qkv, layout, stream);
}

}  // namespace lamina
