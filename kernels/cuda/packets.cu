#include "kernels/cuda/packets.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/chaining.cuh"
#include "kernels/cuda/flags.cuh"
#include "kernels/cuda/hop_clock.cuh"
#include "kernels/cuda/lines.cuh"
#include "kernels/cuda/packets.cuh"

namespace lamina::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPacketsARound = kThreads / kPacketPieces;  // a block's packets in one store instruction a lane
// How the packet kernels are cut (measured with lamina-bench-link-echo; the figures are in this
// file's history):
//  - SendPackets: a block a round of 32 packets, one piece a lane, so that a hop leaves from as
//    many SMs as it can (4 rounds a lane took 256 rows from 37.7 to 44 us);
//  - ReceivePackets: a block a group of 4 rounds (128 packets), every group at once: a block taking
//    several groups in turn waits a memory round trip for each (with 32 blocks, 64 rows took 21
//    against 13.5 us). Past kFourRoundsMostPackets, groups of 16 rounds (1024 rows: 128 against
//    182 us in groups of 4).
//  - Up to kMostPacketPollingBlocks blocks poll from the start, as ReceiveLines' do; more wait
//    behind one warp polling the hop's first packet (WaitForFirstPacketKernel), so that they do not
//    hold the GPU's SMs while the sender is still busy: about 3 us more for a hop of one row,
//    nothing from 64 rows on. Those let a chained kernel after them start at once (the rows are
//    on their way by then): 4 chunks of 256 rows went from 127.7 to 119.7 us a layer, 64 rows
//    from 22.3 to 22.5.
constexpr int64_t kFourRoundsMostPackets = 512 * 128;

// Rounds of four packets a ReceivePacketsKernel warp polls at once for a hop of `total` packets.
int PolledRounds(int64_t total) { return total <= kFourRoundsMostPackets ? 4 : 16; }

// A lane a piece (packets.cuh) of a packet; rows in parts of `part_cols` floats, `per_part`
// packets each, `per_row` in all.
__global__ void SendPacketsKernel(const float* src, int64_t src_stride, const int32_t* rows, int total, int part_cols,
                                  int per_part, int per_row, Packet* dst, int64_t dst_stride, uint32_t tag,
                                  const uint32_t* error, uint64_t* sent_at, bool receive_starts_early) {
  WaitForPreviousKernel();
  if (threadIdx.x == 0) StampSent(sent_at);
  const bool failed = ErrorSet(error);
  const int piece = threadIdx.x % kPacketPieces;
  const int p = blockIdx.x * kPacketsARound + threadIdx.x / kPacketPieces;
  if (p >= total) return;
  const int row = p / per_row;
  const PacketSpan span = SpanOf(p - row * per_row, part_cols, per_part, per_row);
  const int col = span.first_col + piece * 4;
  const float* from = src + (rows ? rows[row] : row) * src_stride;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = col + i < span.end_col && HoldsFloat(piece, i) ? __ldcg(from + col + i) : 0.f;
  if (failed) return;
  StorePacketPiece(dst + row * dst_stride + (p - row * per_row), piece,
                   make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                              piece == kPacketPieces - 1 ? tag : __float_as_uint(v[3])));
  // Once stored, not at once: a receive's blocks polling beside the send slowed it (1 row, alone,
  // 5.3 us against 5.2).
  if (receive_starts_early) LetNextKernelStart();
}

// Thread 0 polls the tag of the hop's first packet, then lets the kernel after it (a
// ReceivePacketsKernel launched as its programmatic dependent) start: that grid's blocks spin
// only while the rows travel, not while the sender is still busy with other work.
__global__ void WaitForFirstPacketKernel(const Packet* first, uint32_t tag, int64_t timeout_ns, uint32_t* error,
                                        uint32_t code) {
  if (threadIdx.x == 0) {
    LinePoll poll = LinePoll::Begin(timeout_ns, error, code);
    const volatile uint32_t* word = &first->tag;
    for (int spins = 1; !poll.failed && *word != tag; ++spins) {
      if (spins % kSpinsBetweenChecks == 0) CheckPoll(poll);
    }
  }
  __syncthreads();
  LetNextKernelStart();
}

// Each warp polls kPolledTogether rounds of four packets at once (PollPackets): a lane loads its
// piece, and the packet is in once the lane holding its tag sees it. With `next_starts_early`
// (behind WaitForFirstPacketKernel, when the rows are on their way) a chained kernel after it may
// place its blocks at once, to wait for its end in WaitForPreviousKernel.
template <int kPolledTogether>
__global__ void ReceivePacketsKernel(const Packet* src, int64_t src_stride, uint32_t tag, int64_t timeout_ns,
                                     uint32_t* error, uint32_t code, const int32_t* rows, int total, int part_cols,
                                     int per_part, int per_row, float* dst, int64_t dst_stride, uint64_t* back_at,
                                     bool next_starts_early) {
  if (next_starts_early) LetNextKernelStart();
  LinePoll poll = LinePoll::Begin(timeout_ns, error, code);
  const int piece = threadIdx.x % kPacketPieces;
  const int a_group = kPacketsARound * kPolledTogether;
  for (int base = blockIdx.x * a_group; base < total; base += gridDim.x * a_group) {
    const Packet* at[kPolledTogether];
    uint32_t wanted = 0;
#pragma unroll
    for (int i = 0; i < kPolledTogether; ++i) {
      const int p = base + i * kPacketsARound + threadIdx.x / kPacketPieces;
      at[i] = src + (p < total ? p / per_row * src_stride + p % per_row : 0);
      if (p < total) wanted |= 1u << i;
    }
    uint4 words[kPolledTogether];
    PollPackets<kPolledTogether>(at, wanted, tag, poll, words);
#pragma unroll
    for (int i = 0; i < kPolledTogether; ++i) {
      if (!(wanted & (1u << i))) continue;
      const int p = base + i * kPacketsARound + threadIdx.x / kPacketPieces;
      const int row = p / per_row;
      const PacketSpan span = SpanOf(p - row * per_row, part_cols, per_part, per_row);
      const int col = span.first_col + piece * 4;
      float* to = dst + (rows ? rows[row] : row) * dst_stride + col;
      const float v[4] = {__uint_as_float(words[i].x), __uint_as_float(words[i].y), __uint_as_float(words[i].z),
                          __uint_as_float(words[i].w)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (col + j < span.end_col && HoldsFloat(piece, j)) to[j] = v[j];
      }
    }
  }
  StampBack(back_at);
}

absl::Status CheckShape(const char* what, int64_t count, int64_t cols, int64_t stride, int64_t segments) {
  if (segments < 1 || cols < 0 || cols % segments != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rows of ", cols, " floats in ", segments, " parts (a whole number of floats each)"));
  }
  if (count < 0 || stride < PacketsPerRow(cols, segments) || count * stride > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", count, " rows of ", cols, " floats in ", segments,
                                                   " parts, ", stride, " packets a row (at least ",
                                                   PacketsPerRow(cols, segments), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SendPackets(const float* src, int64_t src_stride, const int32_t* rows, int64_t count, int64_t cols,
                         Packet* dst, int64_t dst_stride, uint32_t tag, const uint32_t* error, cudaStream_t stream,
                         uint64_t* sent_at, int64_t segments, bool receive_starts_early) {
  LAMINA_RETURN_IF_ERROR(CheckShape("SendPackets", count, cols, dst_stride, segments));
  const int64_t part_cols = cols / segments, per_row = PacketsPerRow(cols, segments), total = count * per_row;
  if (total == 0) return absl::OkStatus();
  const int64_t blocks = (total + kPacketsARound - 1) / kPacketsARound;
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchDependent(
      SendPacketsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream, /*early=*/true, src, src_stride,
      rows, static_cast<int>(total), static_cast<int>(part_cols), static_cast<int>(PacketsPerRow(part_cols)),
      static_cast<int>(per_row), dst, dst_stride, tag, error, sent_at, receive_starts_early));
  return absl::OkStatus();
}

absl::Status ReceivePackets(const PacketRows& in, const PollLimit& limit, const RowsOut& out, cudaStream_t stream,
                            const ReceiveOptions& options) {
  const Packet* src = in.packets;
  const int64_t src_stride = in.stride, count = in.count, cols = in.cols, segments = in.segments;
  const uint32_t tag = in.tag;
  const int64_t timeout_ns = limit.timeout_ns;
  uint32_t* error = limit.error;
  const uint32_t code = limit.code;
  const int32_t* rows = out.rows;
  float* dst = out.base;
  const int64_t dst_stride = out.stride;
  uint64_t* back_at = options.back_at;
  const int64_t most_polling_blocks = options.most_polling_blocks;
  const bool starts_with_send = options.starts_with_send;
  LAMINA_RETURN_IF_ERROR(CheckShape("ReceivePackets", count, cols, src_stride, segments));
  const int64_t part_cols = cols / segments, per_row = PacketsPerRow(cols, segments), total = count * per_row;
  if (total == 0) return absl::OkStatus();
  const int rounds = PolledRounds(total);
  const int64_t blocks = ReceivePacketsBlocks(count, cols, segments);
  const bool two_stages = blocks > most_polling_blocks;
  if (two_stages) LAMINA_RETURN_IF_ERROR(WaitForFirstPacket(src, tag, timeout_ns, error, code, stream));
  // Behind the wait, its blocks start once the first packet is in (the wait's trigger); behind a
  // send that lets it, once the send's blocks have stored their packets.
  LAMINA_CUDA_RETURN_IF_ERROR(LaunchDependent(
      rounds == 4 ? ReceivePacketsKernel<4> : ReceivePacketsKernel<16>, dim3(static_cast<unsigned>(blocks)),
      dim3(kThreads), stream, /*early=*/two_stages || starts_with_send, src, src_stride, tag, timeout_ns, error, code,
      rows, static_cast<int>(total), static_cast<int>(part_cols), static_cast<int>(PacketsPerRow(part_cols)),
      static_cast<int>(per_row), dst, dst_stride, back_at, two_stages));
  return absl::OkStatus();
}

int64_t ReceivePacketsBlocks(int64_t count, int64_t cols, int64_t segments) {
  const int64_t total = count * PacketsPerRow(cols, segments), a_group = kPacketsARound * PolledRounds(total);
  return (total + a_group - 1) / a_group;
}

absl::Status WaitForFirstPacket(const Packet* first, uint32_t tag, int64_t timeout_ns, uint32_t* error, uint32_t code,
                                cudaStream_t stream) {
  WaitForFirstPacketKernel<<<1, 32, 0, stream>>>(first, tag, timeout_ns, error, code);
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status PreloadPacketKernels() {
  cudaFuncAttributes attributes;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, SendPacketsKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, WaitForFirstPacketKernel));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, ReceivePacketsKernel<4>));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, ReceivePacketsKernel<16>));
  return absl::OkStatus();
}

}  // namespace lamina::kernels::cuda
