// Where a memory node keeps its KV pool and runs attention: the CPU (float32, bfloat16 or float8
// e4m3 pool, CPU kernels) or a GPU (bf16 or float8 e4m3 pool, CUDA kernels). AttentionExecutor owns the slot
// bookkeeping and validation and hands a backend only well-formed work: slots inside the pool, layers in range. All
// pointers passed in are host memory. Thread-compatible.
#ifndef LAMINA_KV_ATTENTION_KV_BACKEND_H_
#define LAMINA_KV_ATTENTION_KV_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/attention/attention_service.h"
#include "common/tensor/dtype.h"
#include "common/threading/thread_pool.h"
#include "data_plane/device_link.h"
#include "kernels/cpu/attention.h"

struct CUstream_st;

namespace lamina {

struct KvBackendOptions {
  int64_t num_layers;
  int64_t num_slots;
  kernels::cpu::AttentionShape attention;
  // The pool's element type: kF32, kBF16 or kF8E4M3 (common/topology/kv_dtype.h). A GPU's pool is
  // kF8E4M3 or else bf16.
  DType kv_dtype = DType::kF32;
};

// A lane of device-side decode steps on a GPU pool (for a device-side data plane,
// data_plane/device_link.h): q/k/v already in device memory, work queued on the lane's
// own streams without host waits. Each compute-node connection has its lane, so the steps of several
// batches in flight run side by side. A step is ordered after the pool's earlier host-path writes.
// Its Queue* calls each queue a unit of a step (a few launches) and pace themselves: one blocks
// while the lane has as many units queued and not yet started as it keeps ahead of its GPU
// (common/cuda/queue_pacer.h), until the oldest has. A stream holds about a thousand launches,
// and a thread blocked in a launch behind a full one holds back other threads' CUDA calls.
class DeviceKvLane {
 public:
  virtual ~DeviceKvLane() = default;
  virtual CUstream_st* stream() const = 0;
  // A step of `write_slots.size()` sequences: sequence s writes its new k/v at write_slots[s] and
  // attends to slot_ids[slot_begin[s] .. slot_begin[s + 1]), its rows split into `chunks` (ChunkOf;
  // at most the lane's max_chunks, else InvalidArgument). Waits only for this lane's earlier work;
  // allocates what the step needs.
  virtual absl::Status SetStep(absl::Span<const int32_t> write_slots, absl::Span<const int32_t> slot_ids,
                               absl::Span<const int64_t> slot_begin, int chunks) = 0;
  // Queues, for the sequences of chunk `chunk`: their k/v (rows of `qkv` in `layout`, device
  // memory) stored at their write slots, then their attention into the same rows of step_out().
  virtual absl::Status QueueChunk(int64_t layer, int chunk, const float* qkv, const QkvLayout& layout) = 0;
  // QueueChunk with the chunk's hop folded in (DeviceHop::in and out): waits for the rows to
  // arrive in `qkv` (behind a flag, or polling lines or packets), stores, attends, and sends the
  // outputs back (into RowsOut::out, raising its done flag; as lines; or, from step_out()'s rows,
  // as packets).
  // A chunk of no rows is InvalidArgument (nothing would raise the flag): queue the link's own
  // send for it.
  virtual absl::Status QueueLinkedChunk(int64_t layer, int chunk, const float* qkv, const QkvLayout& layout,
                                        const DeviceHop& hop) = 0;
  // A prefill's k/v over a link: the write slots of its pieces, back to back (waits only for this
  // lane's earlier work); then per layer and piece QueueStore, the rows being [count, row_stride]
  // at `qkv` (device memory), their k/v going to slots [first_slot, first_slot + count) of the
  // list.
  virtual absl::Status SetStoreSlots(absl::Span<const int32_t> slots) = 0;
  virtual absl::Status QueueStore(int64_t layer, int64_t first_slot, int64_t count, const float* qkv,
                                  const QkvLayout& layout) = 0;
  // The step's attention outputs, [sequences, q_size] floats.
  virtual const float* step_out() const = 0;
  virtual absl::Status Synchronize() = 0;
  // The GPU time the lane's chunks took since the last call, each from its inputs' arrival to its
  // outputs (the waits for inputs excluded; linked chunks run side by side, and time when several
  // ran counts once): what a memory node's busy fraction counts. Call once the lane is synchronized.
  virtual absl::StatusOr<absl::Duration> TakeBusy() = 0;
};

// A compute node's own pool on its GPU (local attention): a decode step's attention queued on the
// caller's stream, with no host wait and no host work per layer, so that it can be captured into
// the step's CUDA graph. Each caller (a compute node's batch runner) has its own: the step's tables are its.
// Thread-compatible; QueueLayer and QueueStore touch nothing of the pool's bookkeeping.
class LocalKvStep {
 public:
  virtual ~LocalKvStep() = default;
  // The step's tables, for `padded_rows` (>= write_slots.size()) rows: row s writes its new k/v at
  // write_slots[s] and attends to slot_ids[slot_begin[s] .. slot_begin[s + 1]); rows past the
  // last write and read a scratch slot of the pool's own. Their upload is queued on `stream`,
  // after the pool's host-path writes. `repeats`: some sequence has several rows, each attending
  // over the ones before it, so each layer's stores finish before its attention starts.
  virtual absl::Status SetStep(absl::Span<const int32_t> write_slots, absl::Span<const int32_t> slot_ids,
                               absl::Span<const int64_t> slot_begin, int64_t padded_rows, bool repeats,
                               CUstream_st* stream) = 0;
  // What a QueueLayer captured into a graph holds of the tables (their plan and addresses): a graph
  // captured under another key must not be replayed after this SetStep.
  virtual uint64_t graph_key() const = 0;
  // Layer `layer` of the step: each row's k/v (rows of `qkv` in `layout`, device memory) stored at
  // its write slot, then its attention into row s of `out` [padded_rows, out_stride].
  virtual absl::Status QueueLayer(int64_t layer, const float* qkv, const QkvLayout& layout, float* out,
                                  int64_t out_stride, CUstream_st* stream) = 0;
  // A prefill's k/v: row r of the following QueueStore calls goes to slots[r]; upload queued on
  // `stream`.
  virtual absl::Status SetStoreSlots(absl::Span<const int32_t> slots, CUstream_st* stream) = 0;
  virtual absl::Status QueueStore(int64_t layer, const float* qkv, const QkvLayout& layout, CUstream_st* stream) = 0;
};

class KvBackend {
 public:
  virtual ~KvBackend() = default;
  // The GPU of the pool, -1 on the CPU.
  virtual int device() const { return -1; }
  // A new lane of device-side decode steps of up to `max_chunks` (>= 1) chunks each;
  // FailedPrecondition on the CPU. The streams a step's chunks run on are made now, before any wait
  // spins: while a kernel spins, making a process's 32nd or so stream waits until the kernel ends,
  // and other threads' CUDA calls wait behind it.
  virtual absl::StatusOr<std::unique_ptr<DeviceKvLane>> NewDeviceLane(int max_chunks) {
    return absl::FailedPreconditionError("the KV pool is on the CPU: no device-side decode");
  }

  // A new caller of local attention on the pool's GPU; FailedPrecondition on the CPU.
  virtual absl::StatusOr<std::unique_ptr<LocalKvStep>> NewLocalStep() {
    return absl::FailedPreconditionError("the KV pool is on the CPU: no local device steps");
  }

  // Writes one layer's k and v rows (heads first, `row_stride` floats apart) at `slots`.
  virtual absl::Status Store(int64_t layer, absl::Span<const int32_t> slots, const float* k, const float* v,
                             int64_t row_stride) = 0;
  // The slot lists the following Attend calls read: sequence s attends to
  // slot_ids[slot_begin[s] .. slot_begin[s + 1]).
  virtual absl::Status SetContexts(absl::Span<const int32_t> slot_ids, absl::Span<const int64_t> slot_begin) = 0;
  // out[s] = attention of q[s] over sequence s's context, for every sequence of SetContexts.
  virtual absl::Status Attend(int64_t layer, const float* q, int64_t q_stride,  // [seqs, q_stride]
                              float* out, int64_t out_stride) = 0;               // [seqs, out_stride]

  // Store and Attend over a window of the kv heads alone (a tensor-parallel rank's: its k/v rows
  // hold `heads.count` heads, its q and output rows their query heads); the executor has checked
  // the window lies inside the pool's heads. Unimplemented where the backend attends whole heads
  // only (a GPU pool; a float8 pool's attention).
  virtual absl::Status StoreHeads(const KvHeadWindow& heads, int64_t layer, absl::Span<const int32_t> slots,
                                  const float* k, const float* v, int64_t row_stride) {
    return absl::UnimplementedError("this KV pool stores whole heads only (a GPU pool): a tensor-parallel rank's "
                                    "share of the heads needs a pool on the CPU");
  }
  virtual absl::Status AttendHeads(const KvHeadWindow& heads, int64_t layer, const float* q, int64_t q_stride,
                                   float* out, int64_t out_stride) {
    return absl::UnimplementedError("this KV pool attends whole heads only (a GPU pool): a tensor-parallel rank's "
                                    "share of the heads needs a pool on the CPU");
  }
};

// The pool of options.kv_dtype on the CPU kernels: each stored k/v value rounded to it (to nearest
// even for bfloat16; for float8, each head's values scaled to its largest first,
// QuantizeFloat8E4M3 in common/tensor/float8.h). InvalidArgument for another dtype; ResourceExhausted when the pool
// does not fit in memory.
absl::StatusOr<std::unique_ptr<KvBackend>> CreateCpuKvBackend(const KvBackendOptions& options, ThreadPool* pool);

// The pool on GPU `device`: float8 codes and scales for kF8E4M3, quantized as on the CPU
// (kernels/cuda/attention.h's StoreKv), and bf16 for any other options.kv_dtype. FailedPrecondition when this build
// has no CUDA or the device is missing; ResourceExhausted when the pool does not fit on the GPU.
absl::StatusOr<std::unique_ptr<KvBackend>> CreateCudaKvBackend(const KvBackendOptions& options, int device);

}  // namespace lamina

#endif  // LAMINA_KV_ATTENTION_KV_BACKEND_H_
