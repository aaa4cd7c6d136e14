// lamina-bench-hop: a decode layer's hop over the device data plane as lines (line.h), with both
// ends in this process on one GPU, each on a stream of its own, every layer queued ahead as a
// compute node and a memory node queue them over cuda_ipc:
//   compute end: SendLines (q/k/v out), ReceiveLines (attention outputs back);
//   memory end: LinkedDecodeAttention polling its q/k/v lines, storing the new k/v, attending and
//   writing its outputs as lines.
// The lines cross this GPU's memory rather than a link between two GPUs, so the figures are the
// kernels' own part of a round trip; what two GPUs add is the link's latency each way, which
// lamina-bench-data-plane measures where two GPUs are lent. The point is a figure that any one GPU
// can give, for changes to the kernels on the path.
//
// Microseconds a layer in the steady state, for the memory end's launch:
//   flag:  raising a done flag after its output lines (a system-scope fence, then the flag), as
//          cuda_ipc did before 2026-11-24;
//   lines: no flag, the compute end polling the lines (cuda_ipc now), its busy time counted;
//   ahead: the lines polled by a ReceiveLines queued ahead of the attention, as a memory node
//          does when its GPU's budget of waiting blocks has no room for the launch's (spin_budget.h),
//          the attention launched after it has ended, as memory nodes did before e8f8bd2;
//   chained: the lines waited for by a ReceiveLines queued ahead, the attention chained to it
//          (DecodeLink::chained_to_wait), starting once they are in and taking them from the
//          lines itself (memory nodes now);
// and the baseline of the same run, `echo`: the memory end a ReceiveLines and a SendLines with no
// attention between them, the chain of line kernels alone. Ratios: flag ÷ lines, lines ÷ echo,
// ahead ÷ chained.
//
// A second table, for --row-batches, times the path of larger hops, rows behind a flag:
//   compute end: SendRows (q/k/v out, then a flag), WaitFlag and ScatterRows (or ReceiveRows, up to
//   32 rows) for the outputs;
//   memory end (`rows`): LinkedDecodeAttention waiting for the flag in the launch (up to 16 blocks)
//   or chained to a WaitFlag queued ahead, as memory nodes wait, writing its outputs into the
//   compute end's buffer and raising a done flag;
// against, in the same run, `echo` (the memory end a WaitFlag and a SendRows of the q rows back)
// and `alone` (the memory end's StoreKv and DecodeAttention queued back to back, no compute end):
// rows - alone is the data plane's share of a layer on this GPU.
// A third table, for --packet-batches, times the way memory nodes take hops between GPUs joined by
// NVLink, packets (packets.h):
//   compute end: SendPackets (q/k/v out), ReceivePackets (the outputs, a part a kv head);
//   memory end: LinkedDecodeAttention polling its packets and sending its outputs as packets, under
//   the planner's plan (`planner`, PlanDecode), a warp per (sequence, kv head) (`warps`), a warp
//   per query head (`qheads`), and PlanPolledDecode's pick (`polled`, as memory nodes launch);
//   past 128 blocks the launch is chained to a WaitForFirstPacket, as memory nodes queue it where
//   the compute end shares their GPU (spin_budget.h: its sender would find no SM else);
// against `echo`, the memory end a ReceivePackets and a SendPackets of the q rows back.
// Llama-3-8B's layer shape (32 q heads, 8 kv heads, head_dim 128), float32 rows.
//
//   lamina-bench-hop [--layers 256] [--contexts 1,1024] [--batches 1,4,16] [--row-batches 64,256,1024]
//                    [--packet-batches 1,2,4,8,16,32,64]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/packets.h"
#include "tests/bench/gpu_timing.h"

namespace lamina::bench {
namespace {

namespace kc = kernels::cuda;

constexpr int64_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int64_t kQ = kQHeads * kHeadDim, kKv = kKvHeads * kHeadDim, kQkv = kQ + 2 * kKv;
constexpr int64_t kTimeoutNs = 2'000'000'000;
// A linked launch polls for its own lines, or waits for its flag, only up to these many blocks,
// as memory nodes do (cuda_kv_backend.cc).
constexpr int64_t kMostPollingBlocks = 128;
constexpr int64_t kMostWaitingBlocks = 16;

enum class MemoryEnd { kFlag, kLines, kAhead, kChained, kEcho };
enum class RowsEnd { kRows, kEcho, kAlone };
// The packets path's memory end: the linked launch under `plan`, or the echo where null.
struct PacketsEnd {
  const kc::DecodePlan* plan;
};

// One batch's buffers, all on device 0: `batch` sequences of `context` cached tokens each.
struct Hop {
  static absl::StatusOr<Hop> Create(int64_t batch, int64_t context, int sms);

  // Queues `layers` layers of the hop on both streams, held behind `gate` until all are queued.
  absl::Status Queue(MemoryEnd memory, int64_t layers, uint32_t* tag, const cuda::Event& mid, const cuda::Event& end,
                     cudaStream_t compute, cudaStream_t attention, uint64_t* gate) const;
  // The same for rows behind a flag; with kAlone only the memory end's work, on `attention`.
  absl::Status Queue(RowsEnd memory, int64_t layers, uint32_t* tag, const cuda::Event& mid, const cuda::Event& end,
                     cudaStream_t compute, cudaStream_t attention, uint64_t* gate) const;
  // The same for packets.
  absl::Status Queue(PacketsEnd memory, int64_t layers, uint32_t* tag, const cuda::Event& mid,
                     const cuda::Event& end, cudaStream_t compute, cudaStream_t attention, uint64_t* gate) const;
  // The memory end's link: the new k/v in `mirror`, stored at each sequence's last slot; the
  // inputs' and outputs' ways are the caller's to set.
  kc::DecodeLink Link() const {
    const float* rows = mirror.as<float>();
    uint64_t* done = words.as<uint64_t>();
    kc::DecodeLink link;
    link.timeout_ns = kTimeoutNs;
    link.error = error.as<uint32_t>();
    link.error_code = 3;
    link.k = rows + kQ;
    link.v = rows + kQ + kKv;
    link.kv_stride = kQkv;
    link.write_slots = lists.as<int32_t>() + slots + batch + 1;
    link.counters = counters.as<uint32_t>();
    link.busy_ns = done + 1;
    link.busy_start = done + 3;
    return link;
  }
  // Whether the rows path's launch waits for its flag itself rather than behind a WaitFlag.
  bool RowsWaitInLaunch() const { return kc::DecodeBlocks(shape, row_plan, batch) <= kMostWaitingBlocks; }

  int64_t batch = 0, slots = 0;
  kc::AttentionShape shape{kQHeads, kKvHeads, kHeadDim, 0};
  kc::DecodePlan plan;      // for lines: a block per (sequence, kv head)
  kc::DecodePlan row_plan;  // for rows: as planned
  cuda::DeviceBuffer qkv;         // the compute end's rows [batch, kQkv]
  cuda::DeviceBuffer in_lines;    // the memory end's q/k/v lines, mirroring `mirror`
  cuda::DeviceBuffer mirror;      // [batch, kQkv]
  cuda::DeviceBuffer in_packets;   // the memory end's q/k/v packets, mirroring `mirror`
  cuda::DeviceBuffer out_packets;  // the compute end's output packets, a part a kv head
  cuda::DeviceBuffer out_lines;   // the compute end's output lines, mirroring `out_mirror`
  cuda::DeviceBuffer out_mirror;  // [batch, kQ]
  cuda::DeviceBuffer out;         // the compute end's outputs [batch, kQ]
  cuda::DeviceBuffer k, v;        // the cache, [batch * context, kKv] bf16 each
  cuda::DeviceBuffer lists;       // slot ids, slot begins, write slots (int32)
  cuda::DeviceBuffer counters;    // the linked launch's (LinkedDecodeCounters), uint32
  cuda::DeviceBuffer words;       // done, busy_ns[2], busy_start, ready (uint64), SendRows' arrivals (2 uint32)
  cuda::DeviceBuffer workspace;
  cuda::DeviceBuffer error;  // uint32
};

absl::StatusOr<Hop> Hop::Create(int64_t batch, int64_t context, int sms) {
  Hop h;
  h.batch = batch;
  h.slots = batch * context;
  h.plan = kc::PlanDecode(h.shape, batch, context, sms);
  h.row_plan = h.plan;
  // Lines go a block per (sequence, kv head), as memory nodes launch them.
  if (h.plan.strategy == kc::DecodeStrategy::kWarpPerHead) h.plan.strategy = kc::DecodeStrategy::kBlockPerHead;
  const int64_t slots = batch * context;
  LAMINA_ASSIGN_OR_RETURN(h.qkv, cuda::DeviceBuffer::CreateZeroed(batch * kQkv * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(h.in_lines, cuda::DeviceBuffer::CreateZeroed(batch * kQkv / 2 * sizeof(kc::Line)));
  LAMINA_ASSIGN_OR_RETURN(h.mirror, cuda::DeviceBuffer::CreateZeroed(batch * kQkv * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(h.in_packets,
                          cuda::DeviceBuffer::CreateZeroed(batch * kc::PacketsPerRow(kQkv) * sizeof(kc::Packet)));
  LAMINA_ASSIGN_OR_RETURN(h.out_packets, cuda::DeviceBuffer::CreateZeroed(
                                             batch * kc::PacketsPerRow(kQ, kKvHeads) * sizeof(kc::Packet)));
  LAMINA_ASSIGN_OR_RETURN(h.out_lines, cuda::DeviceBuffer::CreateZeroed(batch * kQ / 2 * sizeof(kc::Line)));
  LAMINA_ASSIGN_OR_RETURN(h.out_mirror, cuda::DeviceBuffer::CreateZeroed(batch * kQ * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(h.out, cuda::DeviceBuffer::CreateZeroed(batch * kQ * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(h.k, cuda::DeviceBuffer::CreateZeroed(slots * kKv * sizeof(kc::bf16)));
  LAMINA_ASSIGN_OR_RETURN(h.v, cuda::DeviceBuffer::CreateZeroed(slots * kKv * sizeof(kc::bf16)));
  // Values as a layer's, not zeros (see kc::FillUniform).
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(h.qkv.as<float>(), batch * kQkv, 1.f, 1, nullptr));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(h.k.as<kc::bf16>(), slots * kKv, 1.f, 2, nullptr));
  LAMINA_RETURN_IF_ERROR(kc::FillUniform(h.v.as<kc::bf16>(), slots * kKv, 1.f, 3, nullptr));
  std::vector<int32_t> lists(slots + 2 * batch + 1);
  for (int64_t i = 0; i < slots; ++i) lists[i] = static_cast<int32_t>(i);
  for (int64_t s = 0; s <= batch; ++s) lists[slots + s] = static_cast<int32_t>(s * context);
  for (int64_t s = 0; s < batch; ++s) lists[slots + batch + 1 + s] = static_cast<int32_t>((s + 1) * context - 1);
  LAMINA_ASSIGN_OR_RETURN(h.lists, cuda::DeviceBuffer::Create(lists.size() * sizeof(int32_t)));
  LAMINA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(h.lists.data(), lists.data(), lists.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  LAMINA_ASSIGN_OR_RETURN(
      h.counters, cuda::DeviceBuffer::CreateZeroed(kc::LinkedDecodeCounters(h.shape, batch) * sizeof(uint32_t)));
  LAMINA_ASSIGN_OR_RETURN(h.words, cuda::DeviceBuffer::CreateZeroed(6 * sizeof(uint64_t)));
  LAMINA_ASSIGN_OR_RETURN(h.workspace,
                          cuda::DeviceBuffer::CreateZeroed(
                              std::max<int64_t>({1, h.plan.workspace_floats, h.row_plan.workspace_floats}) * 4));
  LAMINA_ASSIGN_OR_RETURN(h.error, cuda::DeviceBuffer::CreateZeroed(sizeof(uint32_t)));
  return h;
}

absl::Status Hop::Queue(MemoryEnd memory, int64_t layers, uint32_t* tag, const cuda::Event& mid, const cuda::Event& end,
                        cudaStream_t compute, cudaStream_t attention, uint64_t* gate) const {
  uint32_t* gate_error = reinterpret_cast<uint32_t*>(gate + 1);
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, compute));
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, attention));
  const int32_t* slot_ids = lists.as<int32_t>();
  uint32_t* error_word = error.as<uint32_t>();
  uint64_t* done = words.as<uint64_t>();
  for (int64_t layer = 0; layer < layers; ++layer) {
    const uint32_t line_tag = kc::LineTag(++*tag);
    const float* rows = mirror.as<float>();
    if (memory == MemoryEnd::kEcho) {
      LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(in_lines.as<kc::Line>(), kQkv, line_tag, kTimeoutNs, error_word, 2,
                                              nullptr, batch, kQkv, mirror.as<float>(), kQkv, attention));
      LAMINA_RETURN_IF_ERROR(
          kc::SendLines(rows, kQkv, nullptr, batch, kQ, out_lines.as<kc::Line>(), kQ, line_tag, error_word, attention));
    } else {
      kc::DecodeLink link = Link();
      link.out_lines = out_lines.as<kc::Line>();
      link.line_tag = line_tag;
      if (memory == MemoryEnd::kFlag) {
        link.done = done;
        link.done_value = *tag;
      }
      if (memory == MemoryEnd::kAhead) {
        LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(in_lines.as<kc::Line>(), kQkv, line_tag, kTimeoutNs, error_word, 2,
                                                nullptr, batch, kQkv, mirror.as<float>(), kQkv, attention));
      } else if (memory == MemoryEnd::kChained) {
        LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(in_lines.as<kc::Line>(), kQkv, line_tag, kTimeoutNs, error_word, 2,
                                                nullptr, batch, kQkv, nullptr, kQkv, attention, 0,
                                                kc::NextKernel::kStartsOnceIn));
        link.chained_to_wait = true;
        link.lines = in_lines.as<kc::Line>();
        link.lines_mirror = rows;
      } else {
        link.lines = in_lines.as<kc::Line>();
        link.lines_mirror = rows;
      }
      LAMINA_RETURN_IF_ERROR(kc::LinkedDecodeAttention(shape, plan, rows, kQkv, k.as<kc::bf16>(), v.as<kc::bf16>(),
                                                       slot_ids, slot_ids + slots, out_mirror.as<float>(), kQ, batch,
                                                       workspace.as<float>(), link, attention));
    }
    if (layer == layers / 4) LAMINA_RETURN_IF_ERROR(mid.Record(compute));
    LAMINA_RETURN_IF_ERROR(kc::SendLines(qkv.as<float>(), kQkv, nullptr, batch, kQkv, in_lines.as<kc::Line>(), kQkv,
                                         line_tag, error_word, compute));
    LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(out_lines.as<kc::Line>(), kQ, line_tag, kTimeoutNs, error_word, 4, nullptr,
                                            batch, kQ, out.as<float>(), kQ, compute));
  }
  return end.Record(compute);
}

absl::Status Hop::Queue(RowsEnd memory, int64_t layers, uint32_t* tag, const cuda::Event& mid, const cuda::Event& end,
                        cudaStream_t compute, cudaStream_t attention, uint64_t* gate) const {
  uint32_t* gate_error = reinterpret_cast<uint32_t*>(gate + 1);
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, compute));
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, attention));
  const int32_t* slot_ids = lists.as<int32_t>();  // 0, 1, ...: also the batch rows, in order
  const int32_t* write_slots = slot_ids + slots + batch + 1;
  uint32_t* error_word = error.as<uint32_t>();
  uint64_t* done = words.as<uint64_t>();
  uint64_t* ready = done + 4;
  uint32_t* arrivals = reinterpret_cast<uint32_t*>(done + 5);  // the compute end's, the memory end's
  const float* rows = mirror.as<float>();
  cudaStream_t timed = memory == RowsEnd::kAlone ? attention : compute;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const uint64_t value = ++*tag;
    if (memory == RowsEnd::kAlone) {
      LAMINA_RETURN_IF_ERROR(kc::StoreKv(rows + kQ, rows + kQ + kKv, kQkv, write_slots, k.as<kc::bf16>(),
                                         v.as<kc::bf16>(), batch, kKv, attention));
      LAMINA_RETURN_IF_ERROR(kc::DecodeAttention(shape, row_plan, rows, kQkv, k.as<kc::bf16>(), v.as<kc::bf16>(),
                                                 slot_ids, slot_ids + slots, out_mirror.as<float>(), kQ, batch,
                                                 workspace.as<float>(), attention));
    } else if (memory == RowsEnd::kEcho) {
      LAMINA_RETURN_IF_ERROR(kc::WaitFlag(ready, value, kTimeoutNs, error_word, 2, attention));
      LAMINA_RETURN_IF_ERROR(kc::SendRows(rows, kQkv, nullptr, batch, kQ, out_mirror.as<float>(), kQ, done, value,
                                          error_word, arrivals + 1, attention));
    } else {
      kc::DecodeLink link = Link();
      link.ready = ready;
      link.ready_value = value;
      link.done = done;
      link.done_value = value;
      if (!RowsWaitInLaunch()) {
        LAMINA_RETURN_IF_ERROR(kc::WaitFlag(ready, value, kTimeoutNs, error_word, 2, attention));
        link.chained_to_wait = true;
      }
      LAMINA_RETURN_IF_ERROR(kc::LinkedDecodeAttention(shape, row_plan, rows, kQkv, k.as<kc::bf16>(),
                                                       v.as<kc::bf16>(), slot_ids, slot_ids + slots,
                                                       out_mirror.as<float>(), kQ, batch, workspace.as<float>(), link,
                                                       attention));
    }
    if (layer == layers / 4) LAMINA_RETURN_IF_ERROR(mid.Record(timed));
    if (memory == RowsEnd::kAlone) continue;
    LAMINA_RETURN_IF_ERROR(kc::SendRows(qkv.as<float>(), kQkv, nullptr, batch, kQkv, mirror.as<float>(), kQkv, ready,
                                        value, error_word, arrivals, compute));
    if (batch <= kc::ReceiveRowsMaxCount()) {
      LAMINA_RETURN_IF_ERROR(kc::ReceiveRows(done, value, kTimeoutNs, error_word, 4, out_mirror.as<float>(), kQ,
                                             slot_ids, batch, kQ, out.as<float>(), kQ, compute));
    } else {
      LAMINA_RETURN_IF_ERROR(kc::WaitFlag(done, value, kTimeoutNs, error_word, 4, compute));
      LAMINA_RETURN_IF_ERROR(
          kc::ScatterRows(out_mirror.as<float>(), kQ, slot_ids, batch, kQ, out.as<float>(), kQ, compute));
    }
  }
  return end.Record(timed);
}

absl::Status Hop::Queue(PacketsEnd memory, int64_t layers, uint32_t* tag, const cuda::Event& mid,
                        const cuda::Event& end, cudaStream_t compute, cudaStream_t attention, uint64_t* gate) const {
  uint32_t* gate_error = reinterpret_cast<uint32_t*>(gate + 1);
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, compute));
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, attention));
  const int32_t* slot_ids = lists.as<int32_t>();
  uint32_t* error_word = error.as<uint32_t>();
  const float* rows = mirror.as<float>();
  const int64_t in_per_row = kc::PacketsPerRow(kQkv), out_per_row = kc::PacketsPerRow(kQ, kKvHeads);
  const kc::Packet* in = in_packets.as<kc::Packet>();
  for (int64_t layer = 0; layer < layers; ++layer) {
    const uint32_t line_tag = kc::LineTag(++*tag);
    if (memory.plan == nullptr) {
      LAMINA_RETURN_IF_ERROR(kc::ReceivePackets({in, in_per_row, line_tag, batch, kQkv}, {kTimeoutNs, error_word, 2},
                                                {mirror.as<float>(), kQkv}, attention));
      LAMINA_RETURN_IF_ERROR(kc::SendPackets(rows, kQkv, nullptr, batch, kQ, out_packets.as<kc::Packet>(),
                                             out_per_row, line_tag, error_word, attention, nullptr, kKvHeads));
    } else {
      kc::DecodeLink link = Link();
      link.packets = in;
      link.packets_mirror = rows;
      link.out_packets = out_packets.as<kc::Packet>();
      link.line_tag = line_tag;
      // As memory nodes queue a launch of more blocks than poll at once.
      if (kc::DecodeBlocks(shape, *memory.plan, batch) > kMostPollingBlocks) {
        LAMINA_RETURN_IF_ERROR(kc::WaitForFirstPacket(in, line_tag, kTimeoutNs, error_word, 2, attention));
        link.chained_to_wait = true;
      }
      LAMINA_RETURN_IF_ERROR(kc::LinkedDecodeAttention(shape, *memory.plan, rows, kQkv, k.as<kc::bf16>(),
                                                       v.as<kc::bf16>(), slot_ids, slot_ids + slots,
                                                       out_mirror.as<float>(), kQ, batch, workspace.as<float>(), link,
                                                       attention));
    }
    if (layer == layers / 4) LAMINA_RETURN_IF_ERROR(mid.Record(compute));
    LAMINA_RETURN_IF_ERROR(kc::SendPackets(qkv.as<float>(), kQkv, nullptr, batch, kQkv, in_packets.as<kc::Packet>(),
                                           in_per_row, line_tag, error_word, compute));
    LAMINA_RETURN_IF_ERROR(kc::ReceivePackets({out_packets.as<kc::Packet>(), out_per_row, line_tag, batch, kQ, kKvHeads},
                                              {kTimeoutNs, error_word, 4}, {out.as<float>(), kQ}, compute));
  }
  return end.Record(compute);
}

// Microseconds a layer from the end of the first quarter of the layers to the last, the best of
// `reps` runs after a warm-up.
// The streams and words a hop is timed with.
struct Bench {
  cudaStream_t compute, attention;
  uint64_t* gate;
  uint32_t* tag;
  int64_t layers;
};

// The memory end `memory` (a MemoryEnd or a RowsEnd) of `hop`, queued by Hop::Queue.
template <typename End>
absl::StatusOr<double> SteadyMicros(const Hop& hop, End memory, const Bench& b, int reps = 5) {
  const int64_t layers = b.layers;
  uint64_t* gate = b.gate;
  LAMINA_ASSIGN_OR_RETURN(cuda::Event mid, cuda::Event::Create());
  LAMINA_ASSIGN_OR_RETURN(cuda::Event end, cuda::Event::Create());
  double best = -1;
  for (int rep = -1; rep < reps; ++rep) {
    __atomic_store_n(gate, 0, __ATOMIC_RELEASE);
    *reinterpret_cast<uint32_t*>(gate + 1) = 0;
    const absl::Status queued = hop.Queue(memory, layers, b.tag, mid, end, b.compute, b.attention, gate);
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(b.compute));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(b.attention));
    LAMINA_RETURN_IF_ERROR(queued);
    uint32_t error = 0;
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&error, hop.error.data(), sizeof(error), cudaMemcpyDeviceToHost));
    if (error != 0 || *reinterpret_cast<uint32_t*>(gate + 1) != 0) {
      return absl::DeadlineExceededError(absl::StrCat("batch ", hop.batch, ": a wait gave up (error word ", error,
                                                      "): the hop's kernels did not run side by side"));
    }
    LAMINA_ASSIGN_OR_RETURN(const float ms, end.ElapsedSince(mid));
    const int64_t timed_layers = layers - layers / 4;  // the last three quarters are timed
    const double us = ms * 1e3 / static_cast<double>(timed_layers);
    if (rep >= 0 && (best < 0 || us < best)) best = us;
  }
  return best;
}

// A plan's name in the packets table.
std::string PlanName(const kc::DecodePlan& plan) {
  switch (plan.strategy) {
    case kc::DecodeStrategy::kWarpPerQueryHead: return "qheads";
    case kc::DecodeStrategy::kWarpPerHead: return "warps";
    case kc::DecodeStrategy::kDeepTiled: return absl::StrCat("deep", plan.splits > 1 ? absl::StrCat("/", plan.splits) : "");
    case kc::DecodeStrategy::kTiled: return absl::StrCat("tiled", plan.splits > 1 ? absl::StrCat("/", plan.splits) : "");
    default: return absl::StrCat("cores", plan.splits > 1 ? absl::StrCat("/", plan.splits) : "");
  }
}

// The third table: packets, each memory end's launch against the echo.
absl::Status PacketsTable(const std::vector<int32_t>& contexts, const std::vector<int32_t>& batches, int sms,
                          const Bench& bench) {
  std::printf("\nPackets (SendPackets, ReceivePackets; the outputs a part a kv head), us a layer: the memory end's\n"
              "linked launch polling its packets and sending its outputs, under the planner's plan, a warp per\n"
              "(sequence, kv head), a warp per query head, and PlanPolledDecode's pick (as memory nodes launch);\n"
              "echo = a ReceivePackets and a SendPackets of the q rows back instead\n\n");
  std::printf("%8s %6s | %8s %8s %8s %8s %8s | %8s %8s | %12s %12s %12s\n", "context", "batch", "echo", "planner",
              "warps", "qheads", "polled", "planner", "polled", "qheads÷warps", "qheads÷plnr", "polled÷echo");
  for (const int32_t context : contexts) {
    for (const int32_t batch : batches) {
      LAMINA_ASSIGN_OR_RETURN(Hop hop, Hop::Create(batch, context, sms));
      kc::DecodePlan warps, qheads;
      warps.strategy = kc::DecodeStrategy::kWarpPerHead;
      qheads.strategy = kc::DecodeStrategy::kWarpPerQueryHead;
      const kc::DecodePlan planner = hop.row_plan;
      const kc::DecodePlan polled = kc::PlanPolledDecode(hop.shape, planner, batch, context, sms);
      auto time = [&](const kc::DecodePlan* plan) { return SteadyMicros(hop, PacketsEnd{plan}, bench); };
      LAMINA_ASSIGN_OR_RETURN(const double echo, time(nullptr));
      LAMINA_ASSIGN_OR_RETURN(const double planner_us, time(&planner));
      LAMINA_ASSIGN_OR_RETURN(const double warps_us, time(&warps));
      LAMINA_ASSIGN_OR_RETURN(const double qheads_us, time(&qheads));
      LAMINA_ASSIGN_OR_RETURN(const double polled_us, time(&polled));
      std::printf("%8d %6d | %8.2f %8.2f %8.2f %8.2f %8.2f | %8s %8s | %12.2f %12.2f %12.2f\n", context, batch, echo,
                  planner_us, warps_us, qheads_us, polled_us, PlanName(planner).c_str(), PlanName(polled).c_str(),
                  qheads_us / warps_us, qheads_us / planner_us, polled_us / echo);
    }
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"layers", "contexts", "batches", "row-batches",
                                                                       "packet-batches"},
                                                                {}));
  LAMINA_ASSIGN_OR_RETURN(const int64_t layers, flags.Int("layers", 256));
  if (layers < 8) return absl::InvalidArgumentError(absl::StrCat("--layers ", layers, ": at least 8"));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> contexts,
                          cli::ParseIdList("--contexts", flags.String("contexts", "1,1024")));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> batches,
                          cli::ParseIdList("--batches", flags.String("batches", "1,4,16")));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> row_batches,
                          cli::ParseIdList("--row-batches", flags.String("row-batches", "64,256,1024")));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> packet_batches,
                          cli::ParseIdList("--packet-batches", flags.String("packet-batches", "1,2,4,8,16,32,64")));
  for (const int32_t n : contexts) {
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--contexts: ", n, " (at least 1)"));
  }
  for (const int32_t n : row_batches) {
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--row-batches: ", n, " (at least 1)"));
  }
  for (const int32_t n : packet_batches) {
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--packet-batches: ", n, " (at least 1)"));
  }
  for (const int32_t n : batches) {
    if (n < 1 || n > kc::ReceiveRowsMaxCount()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batches: ", n, " (lines carry 1 to ", kc::ReceiveRowsMaxCount(), " rows)"));
    }
  }
  // Every kernel loaded now: with CUDA's lazy loading a kernel's first launch may wait for the
  // device to go idle, which it never does while the other end's polls spin.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  cudaDeviceProp prop;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs: a layer's hop as lines, both ends on this GPU (two streams), %lld layers queued ahead\n",
              prop.name, prop.multiProcessorCount, static_cast<long long>(layers));
  std::printf("Llama-3-8B shape, float32 rows; us a layer, steady state, best of 5\n\n");
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream compute, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream attention, cuda::Stream::Create());
  LAMINA_ASSIGN_OR_RETURN(cuda::PinnedBuffer gate_words, cuda::PinnedBuffer::Create(2 * sizeof(uint64_t)));
  uint64_t* gate = gate_words.as<uint64_t>();
  uint32_t tag = 0;
  const Bench bench{compute.get(), attention.get(), gate, &tag, layers};
  std::printf("%8s %6s %7s | %8s %8s %8s %8s | %8s | %11s %11s %14s\n", "context", "batch", "blocks", "flag", "lines",
              "ahead", "chained", "echo", "flag÷lines", "lines÷echo", "ahead÷chained");
  for (const int32_t context : contexts) {
    for (const int32_t batch : batches) {
      LAMINA_ASSIGN_OR_RETURN(Hop hop, Hop::Create(batch, context, prop.multiProcessorCount));
      const int64_t blocks = kc::DecodeBlocks(hop.shape, hop.plan, batch);
      auto time = [&](MemoryEnd memory) { return SteadyMicros(hop, memory, bench); };
      LAMINA_ASSIGN_OR_RETURN(const double echo, time(MemoryEnd::kEcho));
      LAMINA_ASSIGN_OR_RETURN(const double ahead, time(MemoryEnd::kAhead));
      LAMINA_ASSIGN_OR_RETURN(const double chained, time(MemoryEnd::kChained));
      double flag = -1, lines = -1;
      if (blocks <= kMostPollingBlocks) {
        LAMINA_ASSIGN_OR_RETURN(flag, time(MemoryEnd::kFlag));
        LAMINA_ASSIGN_OR_RETURN(lines, time(MemoryEnd::kLines));
      }
      if (lines < 0) {
        std::printf(
            "%8d %6d %7lld | %8s %8s %8.2f %8.2f | %8.2f | %11s %11s %14.2f   (polled ahead past %lld blocks)\n",
            context, batch, static_cast<long long>(blocks), "-", "-", ahead, chained, echo, "-", "-", ahead / chained,
            static_cast<long long>(kMostPollingBlocks));
      } else {
        std::printf("%8d %6d %7lld | %8.2f %8.2f %8.2f %8.2f | %8.2f | %11.2f %11.2f %14.2f\n", context, batch,
                    static_cast<long long>(blocks), flag, lines, ahead, chained, echo, flag / lines, lines / echo,
                    ahead / chained);
      }
    }
  }
  std::printf("\nRows behind a flag (SendRows, WaitFlag), us a layer: rows = the memory end's linked attention;\n"
              "echo = a WaitFlag and SendRows back instead; alone = its StoreKv and DecodeAttention, nothing moving\n\n");
  std::printf("%8s %6s %7s %7s | %8s %8s %8s | %10s %12s\n", "context", "batch", "blocks", "waits", "rows", "echo",
              "alone", "rows-alone", "rows÷(e+a)");
  for (const int32_t context : contexts) {
    for (const int32_t batch : row_batches) {
      LAMINA_ASSIGN_OR_RETURN(Hop hop, Hop::Create(batch, context, prop.multiProcessorCount));
      auto time = [&](RowsEnd memory) { return SteadyMicros(hop, memory, bench); };
      LAMINA_ASSIGN_OR_RETURN(const double echo, time(RowsEnd::kEcho));
      LAMINA_ASSIGN_OR_RETURN(const double alone, time(RowsEnd::kAlone));
      LAMINA_ASSIGN_OR_RETURN(const double rows, time(RowsEnd::kRows));
      std::printf("%8d %6d %7lld %7s | %8.2f %8.2f %8.2f | %10.2f %12.2f\n", context, batch,
                  static_cast<long long>(kc::DecodeBlocks(hop.shape, hop.row_plan, batch)),
                  hop.RowsWaitInLaunch() ? "launch" : "ahead", rows, echo, alone, rows - alone, rows / (echo + alone));
    }
  }
  return PacketsTable(contexts, packet_batches, prop.multiProcessorCount, bench);
}

}  // namespace
}  // namespace lamina::bench

int main(int argc, char** argv) { return lamina::bench::BenchMain("lamina-bench-hop", argc, argv, lamina::bench::Run); }
