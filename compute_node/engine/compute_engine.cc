#include "compute_node/engine/compute_engine.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "compute_node/engine/cpu_slice_backend.h"

namespace lamina {
namespace {

// `exchange` (sends to or waits on other nodes), bracketed for the backend's busy timing: a GPU
// backend leaves it out of the node's computing time.
absl::Status Exchange(SliceBackend& b, absl::FunctionRef<absl::Status()> exchange) {
  LAMINA_RETURN_IF_ERROR(b.BeginExchange());
  const absl::Status status = exchange();
  const absl::Status ended = b.EndExchange();
  return status.ok() ? ended : status;
}

}  // namespace

ComputeEngine::ComputeEngine(const ModelWeights* weights, AttentionService* attention, ThreadPool* pool)
    : ComputeEngine(std::make_unique<CpuSliceBackend>(weights, pool), std::make_unique<CpuSliceBackend>(weights, pool),
                    attention) {}

ComputeEngine::ComputeEngine(std::unique_ptr<SliceBackend> prefill, std::unique_ptr<SliceBackend> decode,
                             AttentionService* attention)
    : attention_(attention), prefill_(std::move(prefill)), decode_(std::move(decode)) {}

absl::Status ComputeEngine::CheckToken(int32_t token, int32_t position) const {
  if (token < 0 || token >= config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", token, " is outside the vocabulary (size ",
                                                   config().vocab_size, ")"));
  }
  if (position < 0 || position >= config().max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("position ", position, " is beyond the model's context of ",
                                                   config().max_position_embeddings, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status ComputeEngine::Prefill(absl::Span<const PrefillSequence> prompts, bool all_positions,
                                    Tensor* logits) {
  return PrefillThen(prompts, [&](SliceBackend& b) {
    std::vector<int64_t> rows;
    int64_t end = 0;
    for (const PrefillSequence& p : prompts) {
      const int64_t n = static_cast<int64_t>(p.tokens.size());
      for (int64_t r = all_positions ? end : end + n - 1; r < end + n; ++r) rows.push_back(r);
      end += n;
    }
    return b.RunLast(rows, logits);
  });
}

absl::Status ComputeEngine::Prefill(absl::Span<const PrefillSequence> prompts, absl::Span<const TokenDraw> draws,
                                    int32_t* tokens, TokenLogprobs* logprobs) {
  for (const TokenDraw& d : draws) {
    if (d.row < 0 || d.row >= static_cast<int64_t>(prompts.size())) {
      return absl::InvalidArgumentError(absl::StrCat("a draw names prompt ", d.row, " of ", prompts.size()));
    }
  }
  return PrefillThen(prompts, [&](SliceBackend& b) {
    std::vector<int64_t> last_row;  // of each prompt
    int64_t end = 0;
    for (const PrefillSequence& p : prompts) last_row.push_back((end += static_cast<int64_t>(p.tokens.size())) - 1);
    std::vector<TokenDraw> at_rows(draws.begin(), draws.end());
    for (TokenDraw& d : at_rows) d.row = last_row[d.row];
    return b.RunLastAndSample(at_rows, tokens, logprobs);
  });
}

absl::Status ComputeEngine::PrefillThen(absl::Span<const PrefillSequence> prompts, LastSlice last) {
  const ModelConfig& c = config();
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  for (const PrefillSequence& p : prompts) {
    if (p.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", p.seq, ": empty prompt"));
    if (static_cast<int64_t>(p.tokens.size()) > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", p.seq, ": prompt of ", p.tokens.size(),
                                                     " tokens is longer than the model's context of ",
                                                     c.max_position_embeddings));
    }
    for (size_t t = 0; t < p.tokens.size(); ++t) {
      LAMINA_RETURN_IF_ERROR(CheckToken(p.tokens[t], static_cast<int32_t>(t)));
      positions.push_back(static_cast<int32_t>(t));
    }
    tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
  }
  std::vector<Reservation> reservations;
  for (const PrefillSequence& p : prompts) reservations.push_back({p.seq, static_cast<int32_t>(p.tokens.size())});
  // The node running slice 0 reserves on the memory nodes; a node with a share of a pool of its
  // own reserves there too.
  if (Owns(0) || attention_->has_own_pool()) LAMINA_RETURN_IF_ERROR(attention_->Reserve(reservations));
  // From here on a failure frees the prompts' slots, so nothing is left half-written.
  absl::Status status = RunPrefill(prompts, tokens, positions, last);
  if (!status.ok()) {
    for (const PrefillSequence& p : prompts) attention_->Free(p.seq);
  }
  return status;
}

absl::Status ComputeEngine::RunPrefill(absl::Span<const PrefillSequence> prompts, absl::Span<const int32_t> tokens,
                                       absl::Span<const int32_t> positions, LastSlice last) {
  SliceBackend& b = *prefill_;
  const QkvLayout qkv = b.qkv_layout();
  // The prompts' k/v go GPU to GPU where every memory node involved has a link for them (a GPU
  // backend has a stream; its buffers are read per layer, as RunFirst may grow them). A rotating
  // batch's node stores the layers of its own slices, if any.
  DeviceDecode* device = b.device_batch().stream != nullptr ? attention_->device_decode() : nullptr;
  const std::vector<int64_t> layers = OwnedLayers();
  std::vector<DeviceDecode::PromptRows> rows;
  for (const PrefillSequence& p : prompts) {
    const int64_t first = rows.empty() ? 0 : rows.back().first_row + rows.back().count;
    rows.push_back({p.seq, first, static_cast<int64_t>(p.tokens.size())});
  }
  // Every prompt in this node's own pool on its GPU: stored from the device, layer by layer.
  LocalDeviceDecode* local = b.device_batch().stream != nullptr && handoff_ == nullptr
                                 ? attention_->local_device_decode()
                                 : nullptr;
  const bool local_store = local != nullptr && local->HoldsPrompts(rows);
  if (local_store) LAMINA_RETURN_IF_ERROR(local->BeginStore(rows, b.device_batch().stream));
  const bool on_device =
      !local_store && device != nullptr && !layers.empty() && device->CanStoreOnDevice(rows);
  if (on_device && !Owns(0)) {
    // The memory nodes begin this node's layers now, before slice 0's node (which reserves) has
    // handed the batch over; reserving again changes nothing.
    std::vector<Reservation> reservations;
    for (const PrefillSequence& p : prompts) reservations.push_back({p.seq, static_cast<int32_t>(p.tokens.size())});
    LAMINA_RETURN_IF_ERROR(attention_->Reserve(reservations));
  }
  if (on_device) LAMINA_RETURN_IF_ERROR(device->BeginDeviceStore(rows, layers));
  if (device != nullptr && !layers.empty() && !on_device && !local_store && !host_stores_noted_) {
    host_stores_noted_ = true;
    std::fprintf(stderr, "prefills store their k/v on the memory nodes through host memory: not every device link "
                         "carries them\n");
  }
  // Layer `layer`'s attention runs here (causal), and its k/v are stored remotely while the next
  // slices run; the stores are finished, whatever happened, before the prefill returns.
  absl::Status ran = RunSlices(b, tokens, positions, [&](int64_t layer) -> absl::Status {
    for (const DeviceDecode::PromptRows& p : rows) LAMINA_RETURN_IF_ERROR(b.PrefillAttention(p.first_row, p.count));
    if (local_store) {
      const SliceBackend::DeviceBatch batch = b.device_batch();
      return local->QueueStore(layer, batch.qkv, qkv, batch.stream);
    }
    return Exchange(b, [&]() -> absl::Status {
      if (on_device) {
        const SliceBackend::DeviceBatch batch = b.device_batch();
        return device->QueueDeviceStore(layer, batch.qkv, qkv.row_stride, batch.stream);
      }
      LAMINA_ASSIGN_OR_RETURN(const float* qkv_rows, b.HostQkv());
      for (const DeviceDecode::PromptRows& p : rows) {
        const float* base = qkv_rows + p.first_row * qkv.row_stride;
        LAMINA_RETURN_IF_ERROR(attention_->StoreKv(layer, p.seq, 0, p.count, base + qkv.k_offset,
                                                   base + qkv.v_offset, qkv.row_stride));
      }
      return absl::OkStatus();
    });
  }, last);
  if (on_device && !ran.ok()) {
    // Perhaps before every layer's k/v was sent: the memory nodes may wait for the rest.
    b.Synchronize().IgnoreError();
    device->AbandonDeviceStep();
    return ran;
  }
  // After `last`, which waits for the stream. The memory nodes' outcome comes first: after a
  // timed-out wait the cache holds noise.
  absl::Status stored = on_device ? device->EndDeviceStore() : attention_->FlushStores();
  return stored.ok() ? ran : stored;
}

std::vector<int64_t> ComputeEngine::OwnedLayers() const {
  std::vector<int64_t> layers;
  for (int64_t layer = 0; layer < config().num_layers; ++layer) {
    if (Owns(layer)) layers.push_back(layer);
  }
  return layers;
}

absl::Status ComputeEngine::RunSlices(SliceBackend& b, absl::Span<const int32_t> tokens,
                                      absl::Span<const int32_t> positions, LayerAttention attention, LastSlice last) {
  if (handoff_ == nullptr) return RunOwnedSlices(b, tokens, positions, attention, last);
  const int64_t rows = static_cast<int64_t>(positions.size());
  handoff_->BeginPass();
  sends_on_device_ = handoff_->SendsOnDevice(rows);
  receives_on_device_ = handoff_->ReceivesOnDevice(rows);
  positions_set_ = false;
  handover_gave_up_ = false;
  absl::Status status = RunOwnedSlices(b, tokens, positions, attention, last);
  // The next node's inputs and this pass's outcome are in the queued work: see it done. A wait
  // for a hand-over that gave up comes first, as what followed it ran on noise.
  absl::Status synced = b.Synchronize();
  absl::Status handed = handoff_->TakeDeviceStatus();
  handover_gave_up_ = !handed.ok();
  if (!handed.ok()) return handed;
  return status.ok() ? synced : status;
}

absl::Status ComputeEngine::RunOwnedSlices(SliceBackend& b, absl::Span<const int32_t> tokens,
                                           absl::Span<const int32_t> positions, LayerAttention attention,
                                           LastSlice last) {
  const int64_t num_layers = config().num_layers;
  const int64_t rows = static_cast<int64_t>(positions.size());
  // Slice `layer`, then layer `layer`'s attention; the slices another node owns are skipped.
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    if (!Owns(layer)) continue;
    if (layer == 0) {
      LAMINA_RETURN_IF_ERROR(b.RunFirst(tokens, positions));
      positions_set_ = true;
    } else {
      LAMINA_RETURN_IF_ERROR(ResumeIfHandedOver(b, layer, positions));
      LAMINA_RETURN_IF_ERROR(b.RunMiddle(layer));
    }
    LAMINA_RETURN_IF_ERROR(HandOverResidual(b, layer + 1, rows));
    LAMINA_RETURN_IF_ERROR(attention(layer));
    LAMINA_RETURN_IF_ERROR(HandOverAttnOut(b, layer + 1, rows));
  }
  if (!Owns(num_layers)) return absl::OkStatus();
  LAMINA_RETURN_IF_ERROR(ResumeIfHandedOver(b, num_layers, positions));
  return last(b);
}

absl::Status ComputeEngine::ResumeIfHandedOver(SliceBackend& b, int64_t slice, absl::Span<const int32_t> positions) {
  if (Owns(slice - 1)) return absl::OkStatus();
  return Exchange(b, [&] { return ReceiveHandOver(b, slice, positions); });
}

absl::Status ComputeEngine::ReceiveHandOver(SliceBackend& b, int64_t slice, absl::Span<const int32_t> positions) {
  const ModelConfig& c = config();
  const int64_t rows = static_cast<int64_t>(positions.size());
  if (receives_on_device_) {
    LAMINA_RETURN_IF_ERROR(b.ResumeOnDevice(positions, positions_set_));
    positions_set_ = true;
    const SliceBackend::DeviceBatch d = b.device_batch();
    return handoff_->QueueReceive(slice, rows, d.residual, d.attn_out, d.stream);
  }
  handed_residual_.resize(rows * c.hidden_size);
  handed_attn_out_.resize(rows * c.q_size());
  LAMINA_RETURN_IF_ERROR(
      handoff_->Receive(slice, absl::MakeSpan(handed_residual_), absl::MakeSpan(handed_attn_out_)));
  return b.ResumeAt(positions, handed_residual_.data(), handed_attn_out_.data());
}

absl::Status ComputeEngine::HandOverResidual(SliceBackend& b, int64_t slice, int64_t rows) {
  if (Owns(slice)) return absl::OkStatus();
  return Exchange(b, [&] { return SendResidual(b, slice, rows); });
}

absl::Status ComputeEngine::SendResidual(SliceBackend& b, int64_t slice, int64_t rows) {
  if (sends_on_device_) {
    const SliceBackend::DeviceBatch d = b.device_batch();
    return handoff_->QueueSendResidual(slice, d.residual, rows, d.stream);
  }
  handed_residual_.resize(rows * config().hidden_size);
  LAMINA_RETURN_IF_ERROR(b.ReadResidual(handed_residual_.data()));
  return handoff_->SendResidual(slice, handed_residual_);
}

absl::Status ComputeEngine::HandOverAttnOut(SliceBackend& b, int64_t slice, int64_t rows) {
  if (Owns(slice)) return absl::OkStatus();
  return Exchange(b, [&] { return SendAttnOut(b, slice, rows); });
}

absl::Status ComputeEngine::SendAttnOut(SliceBackend& b, int64_t slice, int64_t rows) {
  if (sends_on_device_) {
    LAMINA_RETURN_IF_ERROR(b.AttnOutOnDevice());
    const SliceBackend::DeviceBatch d = b.device_batch();
    return handoff_->QueueSendAttnOut(slice, d.attn_out, rows, d.stream);
  }
  handed_attn_out_.resize(rows * config().q_size());
  LAMINA_RETURN_IF_ERROR(b.ReadAttnOut(handed_attn_out_.data()));
  return handoff_->SendAttnOut(slice, handed_attn_out_);
}

absl::Status ComputeEngine::Decode(absl::Span<const DecodeToken> batch, Tensor* logits) {
  return DecodeThen(batch, [&](SliceBackend& b) {
    std::vector<int64_t> rows(batch.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    return b.RunLast(rows, logits);
  });
}

absl::Status ComputeEngine::Decode(absl::Span<const DecodeToken> batch, absl::Span<const TokenDraw> draws,
                                   int32_t* tokens, TokenLogprobs* logprobs) {
  for (const TokenDraw& d : draws) {
    if (d.row < 0 || d.row >= static_cast<int64_t>(batch.size())) {
      return absl::InvalidArgumentError(absl::StrCat("a draw names batch row ", d.row, " of ", batch.size()));
    }
  }
  return DecodeThen(batch, [&](SliceBackend& b) { return b.RunLastAndSample(draws, tokens, logprobs); });
}

absl::Status ComputeEngine::DecodeThen(absl::Span<const DecodeToken> batch, LastSlice last) {
  const ModelConfig& c = config();
  SliceBackend& b = *decode_;
  entries_.clear();
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  tokens.reserve(batch.size());
  for (const DecodeToken& t : batch) {
    LAMINA_RETURN_IF_ERROR(CheckToken(t.token, t.position));
    positions.push_back(t.position);
    entries_.push_back({t.seq, t.position});
    tokens.push_back(t.token);
  }
  const QkvLayout qkv = b.qkv_layout();
  // Every sequence in this node's own pool on its GPU: the whole step on the device, attention
  // included (one CUDA graph per batch bucket).
  LocalDeviceDecode* local = handoff_ == nullptr && b.device_batch().stream != nullptr
                                 ? attention_->local_device_decode()
                                 : nullptr;
  if (local != nullptr && local->Holds(entries_)) {
    std::vector<Reservation> reservations;
    for (const DecodeToken& t : batch) reservations.push_back({t.seq, t.position + 1});
    LAMINA_RETURN_IF_ERROR(attention_->Reserve(reservations));
    return DecodeLocally(b, local, tokens, positions, last);
  }
  DeviceDecode* device = attention_->device_decode();
  const bool on_device = device != nullptr && device->CanDecodeOnDevice(entries_, qkv) && b.SetAttentionOnDevice(true);
  if (!on_device) b.SetAttentionOnDevice(false);
  // The node running slice 0 reserves; the others' attention calls come after it, in causal
  // order, except on device links, where every node's memory nodes begin its layers at once. A
  // node with a share of a pool of its own reserves there too.
  if (Owns(0) || (handoff_ != nullptr && on_device) || attention_->has_own_pool()) {
    std::vector<Reservation> reservations;
    for (const DecodeToken& t : batch) reservations.push_back({t.seq, t.position + 1});
    LAMINA_RETURN_IF_ERROR(attention_->Reserve(reservations));
  }
  if (on_device && handoff_ != nullptr) return DecodeRotatingOnDevice(b, device, tokens, positions, last);
  if (on_device) {
    LAMINA_RETURN_IF_ERROR(b.RunFirst(tokens, positions));
    return DecodeOnDevice(b, device, last);
  }
  // Layer `layer`'s attention runs on the memory nodes.
  return RunSlices(b, tokens, positions, [&](int64_t layer) {
    return Exchange(b, [&]() -> absl::Status {
      LAMINA_ASSIGN_OR_RETURN(const float* qkv_rows, b.HostQkv());
      return attention_->Decode(layer, entries_, qkv_rows, qkv, b.HostAttnOut(), c.q_size());
    });
  }, last);
}

absl::Status ComputeEngine::DecodeLocally(SliceBackend& b, LocalDeviceDecode* local, absl::Span<const int32_t> tokens,
                                          absl::Span<const int32_t> positions, LastSlice last) {
  LAMINA_ASSIGN_OR_RETURN(const int64_t rows, b.BeginLocalStep(tokens, positions));
  const SliceBackend::DeviceBatch batch = b.device_batch();  // sized by BeginLocalStep
  LAMINA_ASSIGN_OR_RETURN(const uint64_t key, local->BeginStep(entries_, rows, batch.stream));
  const QkvLayout layout = b.qkv_layout();
  const int64_t q_size = config().q_size();
  LAMINA_RETURN_IF_ERROR(b.RunLocalStep(key, [&](int64_t layer) {
    return local->QueueLayer(layer, batch.qkv, layout, batch.attn_out, q_size, batch.stream);
  }));
  return last(b);
}

absl::Status ComputeEngine::DecodeRotatingOnDevice(SliceBackend& b, DeviceDecode* device,
                                                   absl::Span<const int32_t> tokens,
                                                   absl::Span<const int32_t> positions, LastSlice last) {
  const ModelConfig& c = config();
  const std::vector<int64_t> layers = OwnedLayers();
  if (!layers.empty()) LAMINA_RETURN_IF_ERROR(device->BeginDeviceDecode(entries_, layers));
  const int64_t qkv_stride = b.qkv_layout().row_stride;
  absl::Status status = RunSlices(b, tokens, positions, [&](int64_t layer) {
    const SliceBackend::DeviceBatch d = b.device_batch();  // read per layer: RunFirst may grow the buffers
    return Exchange(b, [&] { return device->QueueDeviceDecode(layer, d.qkv, qkv_stride, d.attn_out, c.q_size(), d.stream); });
  }, last);
  if (layers.empty()) return status;
  // RunSlices saw the queued work done. After a hand-over that gave up, or a failure before every
  // layer was queued, the memory nodes did not get all they wait for: that is the cause, and they
  // are not at fault. Otherwise their outcome comes first: after a timed-out wait the outputs are
  // noise.
  if (handover_gave_up_ || !status.ok()) {
    device->AbandonDeviceStep();
    return status;
  }
  return device->EndDeviceDecode();
}

absl::Status ComputeEngine::DecodeOnDevice(SliceBackend& b, DeviceDecode* device, LastSlice last) {
  const ModelConfig& c = config();
  // The memory nodes queue the step while slice 0 runs.
  LAMINA_RETURN_IF_ERROR(device->BeginDeviceDecode(entries_, {}));
  const SliceBackend::DeviceBatch batch = b.device_batch();
  const int64_t qkv_stride = b.qkv_layout().row_stride;
  absl::Status status;
  for (int64_t layer = 0; layer < c.num_layers && status.ok(); ++layer) {
    status = Exchange(b, [&] {
      return device->QueueDeviceDecode(layer, batch.qkv, qkv_stride, batch.attn_out, c.q_size(), batch.stream);
    });
    if (status.ok() && layer + 1 < c.num_layers) status = b.RunMiddle(layer + 1);
  }
  if (!status.ok()) {
    // Some layers were never queued, and the memory nodes wait for them.
    b.Synchronize().IgnoreError();
    device->AbandonDeviceStep();
    return status;
  }
  status = last(b);  // waits for the stream
  // The step's outcome at the memory nodes comes first: after a timed-out wait the logits are noise.
  absl::Status end = device->EndDeviceDecode();
  return end.ok() ? status : end;
}

}  // namespace lamina
