#include "kernels/cuda/data_plane.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/flags.cuh"
#include "kernels/cuda/hop_clock.cuh"
#include "kernels/cuda/lines.cuh"
#include "kernels/cuda/packets.h"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// ScatterRows and GatherRows: a block a row, so that a local copy of a chunk's rows has enough
// bytes in flight (with more rows a block, the compute node's scatter of attention outputs held a
// layer back).
constexpr int64_t kCopyRowsPerBlock = 1;
// SendRows' blocks take few rows, so that a chunk of 64 to 256 rows still spreads over enough SMs
// (its rate over NVLink is about 0.8 of the copy engine's whatever the rows, threads or loads in
// flight per block). Sends that would fill fewer than kSendFewestBlocks blocks so go a block a
// piece of a row instead (kSendPieceItems, one round of loads a thread): faster at tens of rows,
// slower at hundreds (lamina-bench-hop; the figures are in this file's history).
constexpr int64_t kSendRowsPerBlock = 2;
constexpr int64_t kSendFewestBlocks = 128;
// ReceiveRows: a block a row, up to 32. Its blocks spin while they wait, so they stay a small share
// of the GPU, which another lane's slices may need meanwhile; more rows take a one-thread WaitFlag
// and ScatterRows (faster than 4 rows a block up to 128; up to 512 rows in one launch, saving the
// scatter's launch, gained nothing).
constexpr int64_t kReceiveRowsMax = 32;
constexpr int64_t kReceiveRowsPerBlock = 1;
// ReceiveLines: lines each thread polls at once (PollLines), enough for a Llama-3-8B attention
// output row (2048 lines) in one round of a block's 256 threads.
constexpr int kPolledTogether = 8;

// Copies rows first .. first + rows_per_block (of `count`) of `cols` elements: src row
// (src_rows ? src_rows[i] : i) to dst row (dst_rows ? dst_rows[i] : i). Each thread issues kBatch
// loads before their stores, so that enough bytes are in flight to fill a link to a peer GPU;
// loads go through L2, as the rows may have just arrived from a peer.
constexpr int kBatch = 4;
constexpr int64_t kSendPieceItems = kThreads * kBatch;
// SendLines: the most blocks a send of a few rows takes in pieces of rows (see SendLines).
constexpr int64_t kSendLinesPieceBlocks = 24;

template <typename T>
__device__ void CopyBlockRows(const T* __restrict__ src, int64_t src_stride, const int32_t* src_rows,
                              T* __restrict__ dst, int64_t dst_stride, const int32_t* dst_rows, int64_t first,
                              int64_t count, int cols, int64_t rows_per_block) {
  const int items = static_cast<int>(min(count - first, rows_per_block)) * cols;
  for (int base = threadIdx.x; base < items; base += blockDim.x * kBatch) {
    T values[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int item = base + b * blockDim.x;
      if (item < items) {
        const int64_t r = first + item / cols;
        values[b] = __ldcg(src + (src_rows ? src_rows[r] : r) * src_stride + item % cols);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int item = base + b * blockDim.x;
      if (item < items) {
        const int64_t r = first + item / cols;
        dst[(dst_rows ? dst_rows[r] : r) * dst_stride + item % cols] = values[b];
      }
    }
  }
}

// Both copies: float4 when every row start is 16-byte aligned, else floats.
__device__ void CopyBlockRows(bool vectorized, const float* src, int64_t src_stride, const int32_t* src_rows,
                              float* dst, int64_t dst_stride, const int32_t* dst_rows, int64_t first, int64_t count,
                              int64_t cols, int64_t rows_per_block) {
  if (first >= count) return;
  if (vectorized) {
    CopyBlockRows(reinterpret_cast<const float4*>(src), src_stride / 4, src_rows, reinterpret_cast<float4*>(dst),
                  dst_stride / 4, dst_rows, first, count, static_cast<int>(cols / 4), rows_per_block);
  } else {
    CopyBlockRows(src, src_stride, src_rows, dst, dst_stride, dst_rows, first, count, static_cast<int>(cols),
                  rows_per_block);
  }
}

bool Vectorized(const float* src, int64_t src_stride, int64_t cols, const float* dst, int64_t dst_stride) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return aligned(src) && aligned(dst) && cols % 4 == 0 && src_stride % 4 == 0 && dst_stride % 4 == 0;
}

// Chained (chaining.cuh): its blocks may be placed while the kernel before it ends, and wait for it
// before reading anything.
__global__ void SendRowsKernel(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                               float* dst, int64_t dst_stride, uint64_t* flag, uint64_t value, const uint32_t* error,
                               uint32_t* arrivals, bool vectorized, int64_t rows_per_block,
                               int64_t piece_cols, uint64_t* sent_at) {
  StartChained();
  if (threadIdx.x == 0) StampSent(sent_at);
  // Only earlier work on the stream sets the error word: read it now, while the rows are copied.
  const bool failed = threadIdx.x == 0 && ErrorSet(error);
  const int64_t pieces = max((cols + piece_cols - 1) / piece_cols, int64_t{1});
  const int64_t first = blockIdx.x / pieces * rows_per_block, begin = blockIdx.x % pieces * piece_cols;
  CopyBlockRows(vectorized, src + begin, src_stride, rows, dst + begin, dst_stride, nullptr, first, count,
                min(piece_cols, cols - begin), rows_per_block);
  ArriveAndRaise(arrivals, gridDim.x, flag, value, error, &failed);
}

// A kernel chained after it may start once the flag is up (or the wait gave up).
template <bool kExact>
__global__ void WaitFlagKernel(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error,
                               uint32_t code) {
  SpinOnFlag<kExact>(flag, value, timeout_ns, error, code);
  LetNextKernelStart();
}

// A block a row. Thread 0 of each block waits; the barrier then releases the block's copy. The
// row's place in `dst` is read before the wait, so that it is not on the path.
static_assert(kReceiveRowsPerBlock == 1, "ReceiveRowsKernel reads one destination row a block ahead");
__global__ void ReceiveRowsKernel(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error,
                                  uint32_t code, const float* src, int64_t src_stride, const int32_t* rows,
                                  int64_t count, int64_t cols, float* dst, int64_t dst_stride, bool vectorized,
                                  uint64_t* back_at) {
  const int64_t row = blockIdx.x;
  const int64_t to = rows ? rows[row] : row;
  if (threadIdx.x == 0) SpinOnFlag(flag, value, timeout_ns, error, code);
  __syncthreads();
  CopyBlockRows(vectorized, src + row * src_stride, src_stride, nullptr, dst + to * dst_stride, dst_stride, nullptr, 0,
                1, cols, 1);
  StampBack(back_at);
}

// A block a piece of a row: lines [piece * piece_lines, (piece + 1) * piece_lines) of src row
// (rows ? rows[row] : row), where `pieces` pieces make a row. Launched as a programmatic dependent
// of the kernel before it (SendLines), it reads its row's index, then waits for that kernel's
// work. Each thread reads the error word alongside its first loads (only earlier work on the
// stream sets it) and writes nothing once set.
__global__ void SendLinesKernel(const float* src, int64_t src_stride, const int32_t* rows, int64_t cols, Line* dst,
                                int64_t dst_stride, uint32_t tag, const uint32_t* error, bool vectorized, int pieces,
                                int piece_lines, uint64_t* sent_at) {
  const int64_t row = blockIdx.x / pieces;
  const int64_t from_row = rows ? rows[row] : row;
  WaitForPreviousKernel();
  if (threadIdx.x == 0) StampSent(sent_at);
  const bool failed = ErrorSet(error);
  const float* from = src + from_row * src_stride;
  Line* to = dst + row * dst_stride / 2;
  const int begin = static_cast<int>(blockIdx.x % pieces) * piece_lines;
  const int end = min(static_cast<int>(cols / 2), begin + piece_lines);
  for (int base = begin + threadIdx.x; base < end; base += blockDim.x * kBatch) {
    float2 values[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int item = base + b * blockDim.x;
      if (item >= end) continue;
      values[b] = vectorized ? __ldcg(reinterpret_cast<const float2*>(from) + item)
                             : make_float2(__ldcg(from + 2 * item), __ldcg(from + 2 * item + 1));
    }
    if (failed) return;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int item = base + b * blockDim.x;
      if (item < end) StoreLine(to + item, values[b].x, values[b].y, tag);
    }
  }
}

// One row's lines polled into `to` (null: only polled), a thread's lines kPolledTogether at a time.
__device__ void ReceiveLinesRow(const Line* from, uint32_t tag, LinePoll& poll, float* to, int64_t cols,
                                bool vectorized) {
  const int lines = static_cast<int>(cols / 2);
  for (int base = threadIdx.x; base < lines; base += blockDim.x * kPolledTogether) {
    const Line* polled[kPolledTogether];
    int n = 0;
#pragma unroll
    for (int i = 0; i < kPolledTogether; ++i) {
      const int item = base + i * blockDim.x;
      polled[i] = from + (item < lines ? item : 0);
      if (item < lines) n = i + 1;
    }
    float2 values[kPolledTogether];
    PollLines<kPolledTogether>(polled, n, tag, poll, values);
    if (to == nullptr) continue;
#pragma unroll
    for (int i = 0; i < kPolledTogether; ++i) {
      const int item = base + i * blockDim.x;
      if (i >= n) break;
      if (vectorized) {
        reinterpret_cast<float2*>(to)[item] = values[i];
      } else {
        to[2 * item] = values[i].x;
        to[2 * item + 1] = values[i].y;
      }
    }
  }
}

// Block b polls rows b, b + gridDim.x, ... (a block a row unless the launch was given fewer) and
// writes each row's floats to dst row (rows ? rows[row] : row), read before polling so that it is
// not on the path (with dst null, it writes nothing). It lets a kernel chained after it start at
// once, or once the block's rows are in (`next_starts_once_in`); either waits for it to finish
// before reading anything it wrote.
__global__ void ReceiveLinesKernel(const Line* src, int64_t src_stride, uint32_t tag, int64_t timeout_ns,
                                   uint32_t* error, uint32_t code, const int32_t* rows, int64_t count, int64_t cols,
                                   float* dst, int64_t dst_stride, bool vectorized, bool next_starts_once_in,
                                   uint64_t* back_at) {
  if (!next_starts_once_in) LetNextKernelStart();
  LinePoll poll = LinePoll::Begin(timeout_ns, error, code);
  for (int64_t row = blockIdx.x; row < count; row += gridDim.x) {
    float* to = dst != nullptr ? dst + (rows ? rows[row] : row) * dst_stride : nullptr;
    ReceiveLinesRow(src + row * src_stride / 2, tag, poll, to, cols, vectorized);
  }
  if (next_starts_once_in) {
    // Every thread's lines, not just the first thread's to get here.
    __syncthreads();
    LetNextKernelStart();
  }
  StampBack(back_at);
}

bool Aligned8(const float* p, int64_t stride) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0 && stride % 2 == 0; }

// ScatterRows (dst_rows set) and GatherRows (src_rows set). Chained, as SendRowsKernel: after a
// WaitFlag, its blocks are placed once the flag is up rather than once the wait has ended.
__global__ void CopyRowsKernel(const float* src, int64_t src_stride, const int32_t* src_rows, int64_t count,
                               int64_t cols, float* dst, int64_t dst_stride, const int32_t* dst_rows, bool vectorized,
                               uint64_t* back_at) {
  StartChained();
  CopyBlockRows(vectorized, src, src_stride, src_rows, dst, dst_stride, dst_rows, blockIdx.x * kCopyRowsPerBlock, count,
                cols, kCopyRowsPerBlock);
  StampBack(back_at);
}

absl::Status CopyRows(const float* src, int64_t src_stride, const int32_t* src_rows, int64_t count, int64_t cols,
                      float* dst, int64_t dst_stride, const int32_t* dst_rows, cudaStream_t stream,
                      uint64_t* back_at = nullptr) {
  if (count == 0) return absl::OkStatus();
  const int64_t blocks = (count + kCopyRowsPerBlock - 1) / kCopyRowsPerBlock;
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(CopyRowsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                                            stream, src, src_stride, src_rows, count, cols, dst, dst_stride, dst_rows,
                                            Vectorized(src, src_stride, cols, dst, dst_stride), back_at));
  return absl::OkStatus();
}

}  // namespace

absl::Status SendRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                      float* dst, int64_t dst_stride, uint64_t* flag, uint64_t value, const uint32_t* error,
                      uint32_t* arrivals, cudaStream_t stream, uint64_t* sent_at) {
  if (count < 0 || cols < 0) return absl::InvalidArgumentError("SendRows: negative count or cols");
  const bool vectorized = Vectorized(src, src_stride, cols, dst, dst_stride);
  // Row pairs, or pieces of rows when the pairs would be too few blocks; at least one block, so
  // that an empty send still raises its flag.
  const bool pieces = (count + kSendRowsPerBlock - 1) / kSendRowsPerBlock < kSendFewestBlocks;
  const int64_t rows_per_block = pieces ? 1 : kSendRowsPerBlock;
  const int64_t piece_cols = std::max<int64_t>(1, pieces ? std::min(cols, kSendPieceItems * (vectorized ? 4 : 1)) : cols);
  const int64_t blocks =
      std::max<int64_t>(1, (count + rows_per_block - 1) / rows_per_block * ((cols + piece_cols - 1) / piece_cols));
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchChained(SendRowsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                                            stream, src, src_stride, rows, count, cols, dst, dst_stride, flag, value,
                                            error, arrivals, vectorized, rows_per_block, piece_cols, sent_at));
  return absl::OkStatus();
}

absl::Status WaitFlag(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error, uint32_t code,
                      cudaStream_t stream) {
  WaitFlagKernel<false><<<1, 1, 0, stream>>>(flag, value, timeout_ns, error, code);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status WaitFlagEquals(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error, uint32_t code,
                            cudaStream_t stream) {
  WaitFlagKernel<true><<<1, 1, 0, stream>>>(flag, value, timeout_ns, error, code);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status PreloadDataPlaneKernels() {
  cudaFuncAttributes attributes;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, SendRowsKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, WaitFlagKernel<false>));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, WaitFlagKernel<true>));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, ReceiveRowsKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, CopyRowsKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, SendLinesKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, ReceiveLinesKernel));
  return PreloadPacketKernels();
}

int64_t ReceiveRowsMaxCount() { return kReceiveRowsMax; }

absl::Status ReceiveRows(const uint64_t* flag, uint64_t value, int64_t timeout_ns, uint32_t* error, uint32_t code,
                         const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                         float* dst, int64_t dst_stride, cudaStream_t stream, uint64_t* back_at) {
  if (count < 1 || count > kReceiveRowsMax || cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ReceiveRows: ", count, " rows (1 to ", kReceiveRowsMax, ")"));
  }
  const int64_t blocks = (count + kReceiveRowsPerBlock - 1) / kReceiveRowsPerBlock;
  ReceiveRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      flag, value, timeout_ns, error, code, src, src_stride, rows, count, cols, dst, dst_stride,
      Vectorized(src, src_stride, cols, dst, dst_stride), back_at);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status SendLines(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                       Line* dst, int64_t dst_stride, uint32_t tag, const uint32_t* error, cudaStream_t stream,
                       uint64_t* sent_at) {
  if (count < 0 || cols < 0 || cols % 2 != 0 || dst_stride % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("SendLines: ", count, " rows of ", cols, " floats, ", dst_stride,
                                                   " a row (lines need an even number)"));
  }
  if (count == 0) return absl::OkStatus();
  // A few rows go a block a piece of a row, up to kSendLinesPieceBlocks blocks, each thread with
  // one round of loads, so that their lines leave from several SMs at once (faster up to a few
  // rows). More rows go a block a row, which is faster from about 16 rows.
  const int64_t lines = cols / 2;
  const int64_t pieces = std::max<int64_t>(
      1, std::min((lines + kSendPieceItems - 1) / kSendPieceItems, kSendLinesPieceBlocks / count));
  // A programmatic dependent launch: the send's blocks start while the kernel before it finishes
  // (a launch's latency off the hop's path), and wait for it in WaitForPreviousKernel().
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchDependent(SendLinesKernel, dim3(static_cast<unsigned>(count * pieces)),
                                              dim3(kThreads), stream, /*early=*/true, src, src_stride, rows, cols,
                                              dst, dst_stride, tag, error, Aligned8(src, src_stride),
                                              static_cast<int>(pieces),
                                              static_cast<int>((lines + pieces - 1) / pieces), sent_at));
  return absl::OkStatus();
}

absl::Status ReceiveLines(const Line* src, int64_t src_stride, uint32_t tag, int64_t timeout_ns, uint32_t* error,
                          uint32_t code, const int32_t* rows, int64_t count, int64_t cols, float* dst,
                          int64_t dst_stride, cudaStream_t stream, int64_t max_blocks, NextKernel next,
                          uint64_t* back_at) {
  if (count < 1 || count > kReceiveRowsMax || cols < 0 || cols % 2 != 0 || src_stride % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ReceiveLines: ", count, " rows (1 to ", kReceiveRowsMax, ") of ",
                                                   cols, " floats, ", src_stride, " a row (lines need an even number)"));
  }
  const int64_t blocks = max_blocks > 0 ? std::min(count, max_blocks) : count;
  ReceiveLinesKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      src, src_stride, tag, timeout_ns, error, code, rows, count, cols, dst, dst_stride, Aligned8(dst, dst_stride),
      next == NextKernel::kStartsOnceIn, back_at);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status ScatterRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                         float* dst, int64_t dst_stride, cudaStream_t stream, uint64_t* back_at) {
  return CopyRows(src, src_stride, nullptr, count, cols, dst, dst_stride, rows, stream, back_at);
}

absl::Status GatherRows(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                        float* dst, int64_t dst_stride, cudaStream_t stream) {
  return CopyRows(src, src_stride, rows, count, cols, dst, dst_stride, nullptr, stream);
}

}  // namespace lamina::kernels::cuda
