// What a memory node offers a compute node, layer by layer: KV storage in token slots and decode
// attention. The compute node's layer loop talks only to this interface; in single-process mode
// it is the memory node's AttentionExecutor itself (the in-process transport is a pointer
// hand-off), and in a cluster it is a client that carries the same calls over a transport.
//
// Calls of one step: Reserve() for the sequences that grow, then per layer either StoreKv()
// (a prompt's k/v, computed by the compute node's prefill) or Decode() (one new token each).
// Errors are per request: an unknown sequence or unreserved position is InvalidArgument, a full
// pool ResourceExhausted, a lost peer Unavailable; a failed call changes nothing.
#ifndef LAMINA_COMMON_ATTENTION_ATTENTION_SERVICE_H_
#define LAMINA_COMMON_ATTENTION_ATTENTION_SERVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

struct CUstream_st;

namespace lamina {

using SequenceId = int64_t;

// One new token of a sequence in a decode step.
struct DecodeEntry {
  SequenceId seq;
  int32_t position;  // the token's position; positions 0..position are attended
};

// A sequence that grows to `end_position` tokens in this step.
struct Reservation {
  SequenceId seq;
  int32_t end_position;
};

// Where q, k and v sit in the rows of a fused qkv buffer.
struct QkvLayout {
  int64_t row_stride;  // floats between rows
  int64_t q_offset;
  int64_t k_offset;
  int64_t v_offset;
};

// A tensor-parallel rank's share of a sequence's KV (head-level partitioning): kv heads [first,
// first + count) and the query heads grouped with them. The rank's k/v rows hold just those kv
// heads, and its q and output rows just their query heads.
struct KvHeadWindow {
  int64_t first = 0;
  int64_t count = 0;
};

class DeviceDecode;
class LocalDeviceDecode;

class AttentionService {
 public:
  virtual ~AttentionService() = default;

  // Makes sure each sequence (created on first use) has slots for positions [0, end_position).
  // All or nothing: on error no sequence has gained slots.
  virtual absl::Status Reserve(absl::Span<const Reservation> reservations) = 0;

  // Writes one layer's keys and values of positions [first_position, first_position + count).
  // A service may return before the write lands (the rows are copied first); FlushStores then
  // waits for it and reports its error.
  virtual absl::Status StoreKv(int64_t layer, SequenceId seq, int32_t first_position, int64_t count,
                               const float* k, const float* v,  // [count, row_stride], heads first
                               int64_t row_stride) = 0;
  // Waits until every StoreKv so far has landed; the first error among them.
  virtual absl::Status FlushStores() { return absl::OkStatus(); }

  // For each entry i: stores k and v of row i at its position, then attends q of row i over
  // positions 0..position, writing row i of `out`.
  virtual absl::Status Decode(int64_t layer, absl::Span<const DecodeEntry> entries,
                              const float* qkv, const QkvLayout& layout,  // [entries, row_stride]
                              float* out, int64_t out_stride) = 0;        // [entries, out_stride]

  // Frees the sequence's slots; unknown sequences are ignored.
  virtual void Free(SequenceId seq) = 0;

  // The device-side decode of a service whose memory nodes are reached GPU to GPU; null otherwise.
  virtual DeviceDecode* device_decode() { return nullptr; }
  // Attention on the compute node's own GPU in its own process (a local KV pool); null otherwise.
  virtual LocalDeviceDecode* local_device_decode() { return nullptr; }
  // Whether some sequences' KV is in a pool of the caller's own (its share of a layer split's
  // pool, say), which the caller must reserve in itself even where another node reserves on the
  // memory nodes.
  virtual bool has_own_pool() const { return false; }
};

// Decode steps whose exchanges run on the GPUs: q/k/v are read from, and attention outputs written
// to, the compute node's device memory by work queued on its stream, with no host wait per layer.
// A step: CanDecodeOnDevice, BeginDeviceDecode (after Reserve), per layer QueueDeviceDecode
// between the slices, then, once the stream's work is done, EndDeviceDecode. Any error fails the
// step; the memory nodes involved are then reported failed, as for Decode.
class DeviceDecode {
 public:
  virtual ~DeviceDecode() = default;
  // Whether a step over `entries` with rows in `layout` can run this way: every memory node
  // involved is on a device link and its rows fit the link. Opens links on first use.
  virtual bool CanDecodeOnDevice(absl::Span<const DecodeEntry> entries, const QkvLayout& layout) = 0;
  // Starts the step: the memory nodes queue its layers, those of `layers` (ascending), or every
  // layer when it is empty (a compute node that runs only some of the batch's slices, under
  // rotational pipelining, queues only their layers).
  virtual absl::Status BeginDeviceDecode(absl::Span<const DecodeEntry> entries,
                                         absl::Span<const int64_t> layers) = 0;
  // Queues layer `layer` (one of the step's) on `stream`: q/k/v of `qkv` [entries, qkv_stride] out, and attention
  // outputs into `out` [entries, out_stride] (both device memory of the compute node's GPU). A
  // memory node whose exchange cannot be queued is left out of the rest of the step and reported
  // by EndDeviceDecode, while the others get every layer: its failure does not end the step.
  virtual absl::Status QueueDeviceDecode(int64_t layer, const float* qkv, int64_t qkv_stride, float* out,
                                         int64_t out_stride, CUstream_st* stream) = 0;
  // The step's outcome at every memory node; call it (or AbandonDeviceStep) after every
  // successful Begin, once the stream's work is done.
  virtual absl::Status EndDeviceDecode() = 0;
  // Instead of EndDeviceDecode or EndDeviceStore, once the stream's work is done, for a step this
  // node stopped feeding partway: its own inputs never came (under rotation, a hand-over from
  // another compute node gave up), or it failed before queueing every layer. The memory nodes
  // still wait for what it never sent; those waits end now rather than at the link's timeout (the
  // nodes' connections close, and their links open afresh on next use). They are not at fault and
  // are not reported failed.
  virtual void AbandonDeviceStep() = 0;

  // A prefill's k/v the same way, GPU to GPU. `prompts` lists each prompt's rows in the prefill
  // batch, in order. CanStoreOnDevice: whether every memory node involved has a link that carries
  // them. BeginDeviceStore (after Reserve): the memory nodes queue the store's layers, those of
  // `layers` (ascending) or every layer when it is empty, as for BeginDeviceDecode. Per layer of
  // the store, QueueDeviceStore queues on `stream` the sends of that layer's k/v from `qkv` [rows,
  // qkv_stride] and the waits for the memory nodes to have stored them. EndDeviceStore once the
  // stream's work is done: the outcome, failed memory nodes reported as for Decode (or, for a
  // store stopped partway, AbandonDeviceStep).
  struct PromptRows {
    SequenceId seq = 0;
    int64_t first_row = 0;
    int64_t count = 0;
  };
  virtual bool CanStoreOnDevice(absl::Span<const PromptRows> prompts) { return false; }
  virtual absl::Status BeginDeviceStore(absl::Span<const PromptRows> prompts, absl::Span<const int64_t> layers) {
    return absl::UnimplementedError("no device-side store");
  }
  virtual absl::Status QueueDeviceStore(int64_t layer, const float* qkv, int64_t qkv_stride, CUstream_st* stream) {
    return absl::UnimplementedError("no device-side store");
  }
  virtual absl::Status EndDeviceStore() { return absl::UnimplementedError("no device-side store"); }
};

// Attention on the compute node's own GPU, in its own process (a local KV pool): a decode step's
// layers are queued on the engine's stream with no host work between them, so that the whole step
// can be one CUDA graph. A decode step, after Reserve: Holds, BeginStep, then per layer QueueLayer
// between the slices. A prefill, after Reserve: HoldsPrompts, BeginStore, then per layer
// QueueStore. Errors as for Decode; a failed call changes nothing.
class LocalDeviceDecode {
 public:
  virtual ~LocalDeviceDecode() = default;
  // Whether every entry's (or prompt's) sequence is in the local pool.
  virtual bool Holds(absl::Span<const DecodeEntry> entries) = 0;
  virtual bool HoldsPrompts(absl::Span<const DeviceDecode::PromptRows> prompts) = 0;
  // Validates the step as Decode does and queues the upload of its tables on `stream`, for
  // `padded_rows` rows (rows past the entries' read and write nothing of theirs). Returns the key of
  // what a captured QueueLayer holds: a graph captured under another key must not be replayed.
  virtual absl::StatusOr<uint64_t> BeginStep(absl::Span<const DecodeEntry> entries, int64_t padded_rows,
                                             CUstream_st* stream) = 0;
  // Layer `layer` on `stream`: each row's new k/v (rows of `qkv` in `layout`, device memory) stored,
  // then its attention into `out` [padded_rows, out_stride]. Host work: none (capturable).
  virtual absl::Status QueueLayer(int64_t layer, const float* qkv, const QkvLayout& layout, float* out,
                                  int64_t out_stride, CUstream_st* stream) = 0;
  // The prompts' positions [0, count) are stored from rows [first_row, first_row + count) of the
  // prefill batch, layer by layer.
  virtual absl::Status BeginStore(absl::Span<const DeviceDecode::PromptRows> prompts, CUstream_st* stream) = 0;
  virtual absl::Status QueueStore(int64_t layer, const float* qkv, const QkvLayout& layout, CUstream_st* stream) = 0;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_ATTENTION_ATTENTION_SERVICE_H_
