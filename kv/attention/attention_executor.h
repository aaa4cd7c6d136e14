// The memory node's work, behind the AttentionService interface: keeps each sequence's KV in token
// slots of a pool (one slot per position, shared by all layers) and runs decode attention over
// them, on the CPU or a GPU (a KvBackend).
// Thread-compatible: one caller at a time (the node's step loop).
#ifndef LAMINA_KV_ATTENTION_ATTENTION_EXECUTOR_H_
#define LAMINA_KV_ATTENTION_ATTENTION_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/attention/attention_service.h"
#include "common/tensor/dtype.h"
#include "common/threading/thread_pool.h"
#include "data_plane/device_link.h"
#include "kernels/cpu/attention.h"
#include "kv/attention/kv_backend.h"
#include "kv/cache/slot_allocator.h"

namespace lamina {

struct AttentionExecutorOptions {
  int64_t num_layers;
  int64_t num_slots;
  kernels::cpu::AttentionShape attention;
  int cuda_device = -1;  // >= 0: the pool and attention live on this GPU; else on the CPU
  // The pool's element type, kF32, kBF16 or kF8E4M3 (common/topology/kv_dtype.h); a GPU's is
  // kF8E4M3 or else bf16.
  DType kv_dtype = DType::kF32;
};

class AttentionExecutor : public AttentionService {
 public:
  static absl::StatusOr<std::unique_ptr<AttentionExecutor>> Create(const AttentionExecutorOptions& options,
                                                                   ThreadPool* pool = &ThreadPool::Default());

  absl::Status Reserve(absl::Span<const Reservation> reservations) override;
  absl::Status StoreKv(int64_t layer, SequenceId seq, int32_t first_position, int64_t count,
                       const float* k, const float* v, int64_t row_stride) override;
  absl::Status Decode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv,
                      const QkvLayout& layout, float* out, int64_t out_stride) override;
  void Free(SequenceId seq) override;
  // StoreKv and Decode over a window of the kv heads (a tensor-parallel rank's, whose rows hold
  // only its heads: KvHeadWindow). Each rank of a group writes and attends its own heads of the
  // same sequences and slots. InvalidArgument for a window outside the pool's heads; Unimplemented
  // where the pool attends whole heads only (on a GPU, or float8).
  absl::Status StoreKvHeads(const KvHeadWindow& heads, int64_t layer, SequenceId seq, int32_t first_position,
                            int64_t count, const float* k, const float* v, int64_t row_stride);
  absl::Status DecodeHeads(const KvHeadWindow& heads, int64_t layer, absl::Span<const DecodeEntry> entries,
                           const float* qkv, const QkvLayout& layout, float* out, int64_t out_stride);
  // What those two check of the window, for a caller that would rather know before any call.
  absl::Status CheckHeadWindow(const KvHeadWindow& heads) const;
  // Frees every sequence (a new coordinator knows none of them).
  void FreeAll();

  // Makes `to` start with `from`'s first `length` positions (all of them when length < 0), e.g. for
  // several samples from one prompt: the slots are shared by reference count, not copied, and
  // writing a shared position is FailedPrecondition. InvalidArgument for an unknown `from`, an
  // existing `to` or a length beyond `from`.
  absl::Status Fork(SequenceId from, SequenceId to, int64_t length = -1);

  // Device-side decode, for a GPU pool reached over a device link. A lane (one per compute-node
  // connection) has its own stream, so several batches' steps run side by side.
  // Its steps travel in up to `max_chunks` chunks (KvBackend::NewDeviceLane).
  absl::StatusOr<std::unique_ptr<DeviceKvLane>> NewDeviceLane(int max_chunks) {
    return backend_->NewDeviceLane(max_chunks);
  }
  // A piece of a prefill's k/v over a link: `count` positions of `seq` from `first_position`,
  // travelling in transfer `transfer` (attention_protocol.h, kBeginStore).
  struct StorePiece {
    SequenceId seq = 0;
    int32_t first_position = 0;
    int64_t count = 0;
    int32_t transfer = 0;
  };
  // Validates `entries` as Decode does and readies `lane` for the step (slot lists, plans).
  absl::Status PrepareDeviceDecode(absl::Span<const DecodeEntry> entries, int chunks, DeviceKvLane* lane);
  // Queues the layers of step `step` (`rows` rows, prepared) on the lane, every layer or those of
  // `layers` (ascending): per chunk, the link's receive, the store of the new k/v and attention,
  // the link's send; with `linked`, in one launch a chunk where the link gives a DirectHop. Touches
  // no state of the executor (no lock needed); may block while kernels load, and blocks while the
  // lane keeps as much of the step queued ahead as it may (DeviceKvLane), until the compute node's
  // rows let the GPU go on: so a node replies to the step's start first (the flags keep whatever
  // arrives before a wait is queued), and watches the compute node while it queues.
  static absl::Status QueueDeviceDecode(uint64_t step, const AttentionExecutorOptions& options, int64_t rows,
                                        int chunks, absl::Span<const int64_t> layers, bool linked,
                                        DeviceKvLane* lane, MemoryLinkEnd* link);
  // Whether a step's rows may go in linked launches: false when a sequence has several rows (a
  // prompt continuing on the decode path, after an earlier chunk or a cached prefix). Each of its
  // rows attends over the k/v of the rows before it, and a linked launch stores and attends each
  // row in blocks of its own, with nothing ordering one block's store before another's reads.
  // Unlinked, a chunk's k/v are stored before its attention, and the chunks run in order on the
  // lane's stream, where a sequence's rows come in order of position.
  static bool MayLink(absl::Span<const DecodeEntry> entries);
  const AttentionExecutorOptions& options() const { return options_; }
  // The rows of each transfer of `pieces`; InvalidArgument, naming the piece, unless the first
  // piece is in transfer 0 and each other in its predecessor's transfer or the next.
  static absl::StatusOr<std::vector<int64_t>> TransferRows(absl::Span<const StorePiece> pieces);
  // A prefill's k/v over a link, in transfers of at most StoreTransferRows: validates the pieces
  // as StoreKv does (reserved, writable positions) and readies `lane` with their write slots.
  absl::Status PrepareDeviceStore(absl::Span<const StorePiece> pieces, DeviceKvLane* lane);
  // Queues the store's layers on the lane, every layer or those of `layers` (ascending; a compute
  // node running only some of a batch's slices, under rotational pipelining, stores only their
  // k/v): per transfer (attention_protocol::StoreTransferStep; `transfers` holds each one's rows,
  // TransferRows of the prepared pieces), the link's receive of its rows, their store, and the
  // link's (empty) send, which tells the compute node the receive buffer is free again. Like
  // QueueDeviceDecode, touches no state of the executor (and paces itself as it does).
  static absl::Status QueueDeviceStore(uint64_t step, const AttentionExecutorOptions& options,
                                       absl::Span<const int64_t> transfers, absl::Span<const int64_t> layers,
                                       DeviceKvLane* lane, MemoryLinkEnd* link);
  // Local attention on the pool's own GPU (a compute node's pool, attended in its process): each
  // caller keeps a LocalKvStep of its own (FailedPrecondition on the CPU). PrepareLocalStep
  // validates `entries` as Decode does and readies `step` for them, padded to `padded_rows` rows,
  // its upload queued on `stream`; PrepareLocalStore validates a prefill's pieces as StoreKv does
  // and readies `step` to store their rows, back to back. The step's queued work then touches
  // nothing of the executor.
  absl::StatusOr<std::unique_ptr<LocalKvStep>> NewLocalStep() { return backend_->NewLocalStep(); }
  absl::Status PrepareLocalStep(absl::Span<const DecodeEntry> entries, int64_t padded_rows, LocalKvStep* step,
                                CUstream_st* stream);
  absl::Status PrepareLocalStore(absl::Span<const StorePiece> pieces, LocalKvStep* step, CUstream_st* stream);
  // Waits for the lane's queued step; its outcome (DeadlineExceeded when q/k/v stopped coming).
  static absl::Status FinishDeviceDecode(DeviceKvLane* lane, MemoryLinkEnd* link);
  // The GPU the pool lives on; -1 on the CPU.
  int device() const { return backend_->device(); }

  int64_t num_slots() const { return allocator_.num_slots(); }
  int64_t num_free_slots() const { return allocator_.num_free(); }
  int64_t num_shared_slots() const { return allocator_.num_shared(); }
  int64_t num_sequences() const { return static_cast<int64_t>(slots_.size()); }

 private:
  AttentionExecutor(const AttentionExecutorOptions& options, std::unique_ptr<KvBackend> backend)
      : options_(options), backend_(std::move(backend)), allocator_(options.num_slots) {}
  // FailedPrecondition when a position of `seq` in [first, first + count) is shared.
  absl::Status CheckWritable(SequenceId seq, const std::vector<SlotId>& slots, int64_t first, int64_t count) const;
  absl::StatusOr<const std::vector<SlotId>*> SlotsOf(SequenceId seq) const;
  // Decode's checks, then the slot each entry writes into write_slots_.
  absl::Status CheckDecode(int64_t layer, absl::Span<const DecodeEntry> entries);
  // The slots each (checked) entry attends to: entry i's are slot_ids[slot_begin[i] .. slot_begin[i + 1]).
  void GatherContexts(absl::Span<const DecodeEntry> entries, std::vector<int32_t>* slot_ids,
                      std::vector<int64_t>* slot_begin) const;
  // The slots the pieces' positions hold, back to back, once each is checked reserved and writable.
  absl::Status StoreSlots(absl::Span<const StorePiece> pieces, std::vector<int32_t>* slots) const;
  bool IsWhole(const KvHeadWindow& heads) const {
    return heads.first == 0 && heads.count == options_.attention.num_kv_heads;
  }
  // Slots `reservations` still need beyond what their sequences hold.
  int64_t SlotsNeeded(absl::Span<const Reservation> reservations) const;

  AttentionExecutorOptions options_;
  std::unique_ptr<KvBackend> backend_;
  SlotAllocator allocator_;
  absl::flat_hash_map<SequenceId, std::vector<SlotId>> slots_;  // slot of each position
  // Decode's slot lists, gathered once per step (the entries they were gathered for) and kept to
  // avoid per-layer work and allocation.
  std::vector<DecodeEntry> gathered_for_;
  std::vector<int32_t> gathered_slots_;
  std::vector<int64_t> slot_begin_;
  std::vector<int32_t> write_slots_;  // scratch: the slots one call writes
  // PrepareDeviceDecode's slot lists (kept apart from the host path's, which stay cached).
  std::vector<int32_t> device_slot_ids_;
  std::vector<int64_t> device_slot_begin_;
};

}  // namespace lamina

#endif  // LAMINA_KV_ATTENTION_ATTENTION_EXECUTOR_H_
