// Kernels of the device-side data planes (cuda_ipc, nccl): rows written straight into a peer GPU's
// memory and a flag raised after them, a flag waited on by a kernel queued ahead of the work it
// guards, and rows scattered back into a batch. Nothing here involves the host once queued.
//
// Flags are 64-bit words that only grow: a sender stores a value, a receiver waits until the word
// is at least the value it expects, so a flag never needs resetting between steps. The sender's
// row writes are made visible system-wide (one fence per block, after a barrier) before the flag
// is stored with release semantics; the receiver spins with relaxed loads and fences once it sees
// the value (flags.cuh). For a few rows, lines (line.h) replace rows and flag: SendLines and
// ReceiveLines.
//
// No wait is unbounded: WaitFlag gives up after `timeout_ns` and records `code` in `*error`, and a
// SendRows whose `error` word is set does not raise its flag, so a stalled peer turns into a step
// error on both sides rather than a hang. Launchers queue work on `stream` and never synchronize.
// Thread-safe.
//
// Hop clocks, for timing a round trip on the sending GPU (lamina-bench-data-plane): a send given
// `sent_at` lowers *sent_at to the GPU's clock (%globaltimer, ns) when its first block starts
// reading rows (an atomic min: set it to UINT64_MAX first), once the work queued ahead of it has
// finished; a receive given `back_at` raises *back_at to the clock when its last block has
// written its rows (an atomic max: set it to 0 first). Null, the default: nothing is recorded.
#ifndef LAMINA_KERNELS_CUDA_DATA_PLANE_H_
#define LAMINA_KERNELS_CUDA_DATA_PLANE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/line.h"

namespace lamina::kernels::cuda {

// dst row i = src row (rows ? rows[i] : i), for i < count; then, once every row is written,
// *flag = value (unless *error != 0, when error is not null). `dst` and `flag` may be a peer GPU's
// memory (mapped through CUDA IPC). `arrivals` is a zeroed device word of this GPU that the
// launch uses to find its last block, and leaves zeroed. The launch is chained (chaining.h): its
// blocks may be placed while the kernel before it ends, and read nothing until it has.
absl::Status SendRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                      float* dst, int64_t dst_stride, uint64_t* flag, uint64_t value, const uint32_t* error,
                      uint32_t* arrivals, cudaStream_t stream, uint64_t* sent_at = nullptr);

// Holds `stream` until *flag >= value. After `timeout_ns` it stops waiting and sets *error = code
// (when *error is still 0), so later work on the stream runs on whatever is there and the host
// learns of it from *error. Once *error is set, later waits pass at once. A kernel chained after
// it (chaining.h) may start once the wait is over, and then waits for its end as chained kernels do.
absl::Status WaitFlag(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error, uint32_t code,
                      cudaStream_t stream);

// WaitFlag, but until *flag == value: for flags whose values need not grow (a later value may
// already be there from a step that was abandoned, and must not pass for the current one).
absl::Status WaitFlagEquals(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error, uint32_t code,
                            cudaStream_t stream);

// WaitFlag then ScatterRows in one launch, for 1 to ReceiveRowsMaxCount() rows: each block waits
// for the flag, then writes its rows; one launch gap less on the path of a small step.
absl::Status ReceiveRows(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error, uint32_t code,
                         const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                         float* dst, int64_t dst_stride, cudaStream_t stream, uint64_t* back_at = nullptr);
int64_t ReceiveRowsMaxCount();

// Lines (line.h), for hops of a few rows: dst mirrors [count, dst_stride] floats, and its row i
// gets src row (rows ? rows[i] : i) as lines tagged `tag`, with no flag after them. Nothing is
// written when *error != 0 (error may be null). `dst` may be a peer GPU's memory. cols and
// dst_stride must be even. The send may start before the work queued ahead of it on `stream`
// has finished, and reads `rows` then (the rest after that work): nothing queued on the stream may
// write `rows`.
absl::Status SendLines(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                       Line* dst, int64_t dst_stride, uint32_t tag, const uint32_t* error, cudaStream_t stream,
                       uint64_t* sent_at = nullptr);

// When a kernel chained after ReceiveLines (chaining.h) may start:
//  - kStartsAtOnce: while the lines are still on their way, its blocks taking the SMs the polls
//    leave (for work that can read its weights meanwhile);
//  - kStartsOnceIn: once every line is in, so that its blocks hold no SM while the rows travel
//    (for work queued ahead of rows that may come late: a memory node's attention).
// Either way it waits for ReceiveLines to end before reading what it wrote.
enum class NextKernel { kStartsAtOnce, kStartsOnceIn };

// Polls the lines of `count` rows (1 to ReceiveRowsMaxCount()) mirroring [count, src_stride]
// floats until each is tagged `tag`, and writes row i into dst row (rows ? rows[i] : i). A poll
// gives up after `timeout_ns` as WaitFlag does (setting *error = code), and once *error is set
// later polls pass at once. cols and src_stride must be even. A block a row, or at most
// `max_blocks` (> 0) blocks taking the rows in turn: fewer blocks spinning while the rows travel.
// With `dst` null the lines are only waited for: for a kernel chained after it that takes them
// from the lines itself.
absl::Status ReceiveLines(const Line* src, int64_t src_stride, uint32_t tag, int64_t timeout_ns, uint32_t* error,
                          uint32_t code, const int32_t* rows, int64_t count, int64_t cols, float* dst,
                          int64_t dst_stride, cudaStream_t stream, int64_t max_blocks = 0,
                          NextKernel next = NextKernel::kStartsAtOnce, uint64_t* back_at = nullptr);

// Loads the kernels above now. With lazy module loading (CUDA's default) a kernel's first launch
// may wait for the whole device to be idle, which never happens while a WaitFlag queued ahead
// spins on the peer: call this when a link opens, before any wait is queued.
absl::Status PreloadDataPlaneKernels();

// ScatterRows and GatherRows are chained as SendRows is; after a WaitFlag, their blocks are placed
// once the flag is up.
// dst row rows[i] = src row i, for i < count.
absl::Status ScatterRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                         float* dst, int64_t dst_stride, cudaStream_t stream, uint64_t* back_at = nullptr);

// dst row i = src row rows[i], for i < count.
absl::Status GatherRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                        float* dst, int64_t dst_stride, cudaStream_t stream);

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_DATA_PLANE_H_
