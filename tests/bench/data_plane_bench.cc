// The per-layer round trip between a compute node's GPU and a memory node's GPU: q/k/v out, the
// memory node's k/v store and attention, the attention output back. Two processes, as in a
// cluster: this one is the compute end on GPU 0 (RemoteAttention), a child is the memory node
// (AttentionExecutor on GPU 1, behind an AttentionServer). It needs two GPUs: two processes on one
// GPU take turns on it, and lamina-bench-hop times the hop's kernels there instead.
//
// For each batch: tcp (the host path, with the compute node's device-host copies), cuda_ipc in one
// chunk of rows behind a flag, cuda_ipc as lines (up to 32 rows), cuda_ipc in one chunk as
// packets (kernels/cuda/packets.h), cuda_ipc in chunks (communication-attention overlap), and
// nccl. The baseline, measured in the same run, is the peer-copy rate from GPU 0 to the memory
// node's GPU: the target for cuda_ipc is 5 us + bytes / that rate, and at batch 1024 at least 80%
// of it. At a context where attention takes time, the share of the transfer hidden by chunking
// is (one chunk - chunked) / transfer. Times are per layer in the steady state of a step, with
// the GPUs' work queued ahead (see DeviceMicros). A layer's period there is its round trip plus the
// compute end's turn between layers (its receive ending, the next layer's send starting), which in
// a compute node lies among its slices' kernels; the round trip itself, from the send's start to
// the outputs in place, is timed on the compute GPU's clock (the link's hop clock) for cuda_ipc.
// Llama-3-8B's layer shape (32 q heads, 8 kv heads, head_dim 128), float32 rows.
//
//   lamina-bench-data-plane [--layers 8] [--contexts 1,256] [--batches 1,8,64,256,1024] [--chunks 2,4]
//                           [--chunk-rows 128] [--output-parts 8] [--slice-us 0] [--packets-only 0]
//                           [--lanes 1] [--stagger-ns 0] [--beside-ns 0]
// --chunk-rows: the fewest rows a chunk of the chunked columns holds (a topology's chunk_rows); by
// default compute nodes' default.
// --output-parts: the parts a row of attention outputs travels in as packets (LinkShape::
// out_segments); by default a part a kv head, as compute nodes send them.
// --slice-us: in the round trips on the hop clock (the rt columns), the compute end's GPU is busy
// this long before each layer's send, as a compute node's slices keep it between two layers' hops
// (its projections and MLP: tens of microseconds a layer and more); the memory end's launch for
// the layer has then started before the rows leave. 0: the layers back to back, so that the memory
// end's launch races the rows.
// --packets-only 1: only tcp and cuda_ipc as packets in one chunk (the other columns -1). Each
// cuda_ipc or nccl column opens a link of its own, and the memory node gives each link a lane
// whose linked launches share one budget of polling blocks, half the GPU's SMs where there are
// several lanes (kv/attention/spin_budget.h): a launch past it waits behind a kernel
// queued ahead. With packets alone the memory node serves one lane, as for one compute node, whose
// budget is all but a few SMs.
// --lanes N (N > 1): instead of the table, N links stepping alone and then all at once, as the
// batches of several compute nodes (LanesAtOnce); --stagger-ns M: once more with lane i's work
// starting i * M ns after the gate; --beside-ns M: once more lane 0 alone on the link, with the
// other lanes' streams busy-waiting M ns a layer beside it (another batch's slices on the compute
// GPU, no hop).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/cuda/device_buffer.h"
#include "common/topology/topology.h"
#include "common/transport/transport.h"
#include "compute_node/remote/remote_attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/elementwise.h"
#include "kv/attention/attention_executor.h"
#include "memory_node/data_plane/attention_server.h"
#include "tests/bench/gpu_timing.h"
#include "tests/bench/hop_clock.h"

namespace lamina {
namespace {

constexpr int64_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int64_t kQ = kQHeads * kHeadDim, kKv = kKvHeads * kHeadDim, kQkv = kQ + 2 * kKv;

struct Options {
  int64_t layers = 8;
  std::vector<int64_t> contexts = {1, 256};
  std::vector<int64_t> batches = {1, 8, 64, 256, 1024};
  std::vector<int64_t> chunks = {2, 4};  // the chunked cuda_ipc columns: up to this many chunks a layer
  int64_t chunk_rows = kDefaultChunkRows;  // and at least this many rows a chunk
  int64_t output_parts = kKvHeads;
  int64_t slice_us = 0;  // the compute end's other work before each layer's send, in the round trips
  bool packets_only = false;  // only the tcp and packets columns (one link, one memory-node lane)
  int64_t lanes = 1;          // past 1: the lanes-at-once table instead (LanesAtOnce)
  int64_t stagger_ns = 0;     // LanesAtOnce: also at once with lane i starting i * this later
  int64_t beside_ns = 0;      // LanesAtOnce: also lane 0 beside this long a busy wait a layer on the others
};

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) out.push_back(std::stoll(std::string(part)));
  return out;
}

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// The memory node: serves until its parent closes `stop`.
int MemoryNode(const Options& o, int address_out, int stop) {
  const int device = GpuCount() > 1 ? 1 : 0;
  int64_t slots = 0;  // the most sequences at once: the largest batch on each lane
  for (int64_t b : o.batches) slots = std::max(slots, b * std::max<int64_t>(1, o.lanes));
  int64_t context = 0;
  for (int64_t c : o.contexts) context = std::max(context, c);
  auto executor = AttentionExecutor::Create({o.layers, slots * context + 16, {kQHeads, kKvHeads, kHeadDim, 0}, device});
  if (!executor.ok()) {
    std::fprintf(stderr, "memory node: %s\n", std::string(executor.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<Transport> tcp = MakeTcpTransport();
  std::mutex mu;
  auto server = AttentionServer::Start(tcp.get(), "127.0.0.1:0", {o.layers, kQ, kKv, kKvHeads}, executor->get(), &mu,
                                       executor->get());
  if (!server.ok()) return 1;
  const std::string address = (*server)->address() + "\n";
  if (write(address_out, address.data(), address.size()) != static_cast<ssize_t>(address.size())) return 1;
  char byte;
  while (read(stop, &byte, 1) > 0) {
  }
  return 0;
}

// The rate of SendRows (the SM copy that cuda_ipc's compute end sends q/k/v with) from GPU 0 into
// the peer's memory: `rows` rows of q/k/v and the flag behind them, best of 5. Call after
// PeerCopyRate, which enables peer access.
double SendRowsRate(int peer, int64_t rows) {
  const size_t bytes = static_cast<size_t>(rows * kQkv) * sizeof(float);
  cudaSetDevice(peer);
  auto dst = cuda::DeviceBuffer::Create(bytes);
  auto flag = cuda::DeviceBuffer::Create(sizeof(uint64_t));
  cudaSetDevice(0);
  auto src = cuda::DeviceBuffer::Create(bytes);
  auto arrivals = cuda::DeviceBuffer::Create(sizeof(uint32_t));
  if (!dst.ok() || !flag.ok() || !src.ok() || !arrivals.ok()) return 0;
  cudaMemset(arrivals->data(), 0, sizeof(uint32_t));
  auto start = cuda::Event::Create(), end = cuda::Event::Create();
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    start->Record(nullptr).IgnoreError();
    kernels::cuda::SendRows(src->as<float>(), kQkv, nullptr, rows, kQkv, dst->as<float>(), kQkv, flag->as<uint64_t>(),
                            rep + 1, nullptr, arrivals->as<uint32_t>(), nullptr)
        .IgnoreError();
    end->Record(nullptr).IgnoreError();
    cudaEventSynchronize(end->get());
    const float ms = *end->ElapsedSince(*start);
    best = std::max(best, bytes / (ms * 1e-3) / 1e9);
  }
  return best;
}

// GB/s of a copy-engine copy of `bytes` from GPU 0 to `peer` (turning peer access on), best of 5.
// Of 256 MiB, the link's measured rate; of fewer bytes, less, as a transfer's start and end weigh
// more.
double PeerCopyRate(int peer, size_t bytes) {
  cudaSetDevice(peer);
  auto dst = cuda::DeviceBuffer::Create(bytes);
  cudaSetDevice(0);
  auto src = cuda::DeviceBuffer::Create(bytes);
  if (!dst.ok() || !src.ok()) return 0;
  if (peer != 0) cudaDeviceEnablePeerAccess(peer, 0);
  cudaGetLastError();
  auto start = cuda::Event::Create(), end = cuda::Event::Create();
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    start->Record(nullptr).IgnoreError();
    cudaMemcpyPeerAsync(dst->data(), peer, src->data(), 0, bytes, nullptr);
    end->Record(nullptr).IgnoreError();
    cudaEventSynchronize(end->get());
    const float ms = *end->ElapsedSince(*start);
    best = std::max(best, bytes / (ms * 1e-3) / 1e9);
  }
  return best;
}

struct Buffers {
  cuda::DeviceBuffer qkv, out;
  cuda::PinnedBuffer host_qkv, host_out;
  cuda::PinnedBuffer gate;  // uint64 gate, uint32 error: holds the compute stream while a step is queued
};

// Microseconds per layer of the host path: q/k/v to the host, over tcp, outputs back to the GPU.
double TcpMicros(RemoteAttention& remote, const std::vector<DecodeEntry>& entries, const Buffers& b, int64_t layers,
                 int reps) {
  const int64_t n = static_cast<int64_t>(entries.size());
  absl::Time start;
  for (int rep = -1; rep < reps; ++rep) {
    if (rep == 0) start = absl::Now();
    for (int64_t layer = 0; layer < layers; ++layer) {
      cudaMemcpy(b.host_qkv.data(), b.qkv.data(), n * kQkv * sizeof(float), cudaMemcpyDeviceToHost);
      absl::Status s = remote.Decode(layer, entries, b.host_qkv.as<float>(), {kQkv, 0, kQ, kQ + kKv},
                                     b.host_out.as<float>(), kQ);
      if (!s.ok()) {
        std::fprintf(stderr, "tcp: %s\n", std::string(s.message()).c_str());
        return -1;
      }
      cudaMemcpy(b.out.data(), b.host_out.data(), n * kQ * sizeof(float), cudaMemcpyHostToDevice);
    }
  }
  return absl::ToDoubleMicroseconds(absl::Now() - start) / (reps * layers);
}

// Device-side steps, from GPU events: per layer over the whole step, and per layer in the steady
// state (from the end of the first quarter of the layers to the end), the round trip of one layer
// once both ends are under way. What the first layers take beyond the steady rate is the step's
// start. Paced, the compute stream runs as the host queues it, and a few microseconds of launch
// a layer pace tiny steps; queued, the stream is held until both ends have queued the whole step
// (as a compute node's slices, longer than a launch, let them), so the times are the GPUs' alone.
struct DeviceTiming {
  double per_layer_us = -1;
  double steady_us = -1;
  double start_us = -1;       // per step
  double round_trip_us = -1;  // steady layers' mean, on the hop clock (-1: not timed)
};

// One link's step in DeviceMicros: its sequences, rows and stream, and its hop clock (or null).
struct LaneStep {
  RemoteAttention* remote;
  const std::vector<DecodeEntry>* entries;
  const Buffers* b;
  cudaStream_t stream;
  bench::HopClock* clock = nullptr;
  int64_t start_after_ns = 0;  // queued, the lane's GPU work starts this long after the gate opens
  int64_t busy_ns = 0;         // with `remote` null: a busy wait this long a layer instead of a hop
};

// Several links' steps at once, each on its stream, their layers queued in turn, as two batches in
// flight take turns on a compute node's GPU; queued, one gate (`gate`) holds every stream. A lane
// with no link (`remote` null) busy-waits instead of each hop. A timing per lane (all -1 when a
// step failed).
std::vector<DeviceTiming> DeviceMicros(std::vector<LaneStep> lanes, int64_t layers, int reps, bool queued,
                                       uint64_t* gate, int64_t slice_us = 0) {
  const std::vector<DeviceTiming> failed(lanes.size());
  for (LaneStep& lane : lanes) {
    if (lane.remote == nullptr) continue;
    if (!lane.remote->CanDecodeOnDevice(*lane.entries, {kQkv, 0, kQ, kQ + kKv})) {
      std::fprintf(stderr, "the device link did not open\n");
      return failed;
    }
    if (lane.clock != nullptr && !lane.remote->SetHopClock(lane.clock->words()).ok()) lane.clock = nullptr;
  }
  const int64_t warm = std::max<int64_t>(1, layers / 4);
  if (layers <= warm) {
    std::fprintf(stderr, "--layers must be at least 2\n");
    return failed;
  }
  uint32_t* gate_error = reinterpret_cast<uint32_t*>(gate + 1);
  struct Sums {
    cuda::Event start, mid, end;
    double total_ms = 0, steady_ms = 0, round_trip_ns = 0;
    int64_t round_trips = 0;
  };
  std::vector<Sums> sums;
  for (size_t i = 0; i < lanes.size(); ++i) {
    auto start = cuda::Event::Create(), mid = cuda::Event::Create(), end = cuda::Event::Create();
    if (!start.ok() || !mid.ok() || !end.ok()) return failed;
    sums.push_back({std::move(*start), std::move(*mid), std::move(*end)});
  }
  for (int rep = -1; rep < reps; ++rep) {
    absl::Status s;
    if (queued) {
      __atomic_store_n(gate, 0, __ATOMIC_RELEASE);
      *gate_error = 0;
    }
    for (size_t i = 0; i < lanes.size() && s.ok(); ++i) {
      const LaneStep& lane = lanes[i];
      if (lane.clock != nullptr) s = lane.clock->Reset();
      if (s.ok() && lane.remote != nullptr) s = lane.remote->BeginDeviceDecode(*lane.entries, {});
      if (s.ok() && queued) s = kernels::cuda::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, lane.stream);
      if (s.ok() && queued && lane.start_after_ns > 0) s = bench::QueueBusyWait(lane.start_after_ns, lane.stream);
      if (s.ok()) s = sums[i].start.Record(lane.stream);
    }
    for (int64_t layer = 0; layer < layers && s.ok(); ++layer) {
      for (size_t i = 0; i < lanes.size() && s.ok(); ++i) {
        const LaneStep& lane = lanes[i];
        if (layer == warm) s = sums[i].mid.Record(lane.stream);
        if (s.ok() && slice_us > 0) s = bench::QueueBusyWait(slice_us * 1000, lane.stream);
        if (s.ok() && lane.remote == nullptr) {
          s = bench::QueueBusyWait(lane.busy_ns, lane.stream);
        } else if (s.ok()) {
          s = lane.remote->QueueDeviceDecode(layer, lane.b->qkv.as<float>(), kQkv, lane.b->out.as<float>(), kQ,
                                             lane.stream);
        }
      }
    }
    for (size_t i = 0; i < lanes.size() && s.ok(); ++i) s = sums[i].end.Record(lanes[i].stream);
    if (queued) {
      // The memory node queues its side after it answers kBeginDecode: a launch or two a layer.
      absl::SleepFor(absl::Milliseconds(1) + absl::Microseconds(50) * layers * static_cast<int64_t>(lanes.size()));
      __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    }
    for (const LaneStep& lane : lanes) cudaStreamSynchronize(lane.stream);
    for (const LaneStep& lane : lanes) {
      if (lane.remote == nullptr) continue;
      const absl::Status e = lane.remote->EndDeviceDecode();
      if (s.ok()) s = e;
    }
    if (s.ok() && queued && *gate_error != 0) s = absl::DeadlineExceededError("the gate was not seen");
    if (!s.ok()) {
      std::fprintf(stderr, "device step: %s\n", std::string(s.message()).c_str());
      return failed;
    }
    for (size_t i = 0; rep >= 0 && i < lanes.size(); ++i) {
      Sums& sum = sums[i];
      sum.total_ms += *sum.end.ElapsedSince(sum.start);
      sum.steady_ms += *sum.end.ElapsedSince(sum.mid);
      if (lanes[i].clock == nullptr) continue;
      const absl::StatusOr<std::pair<double, int64_t>> trips = lanes[i].clock->Sum(warm);
      if (trips.ok()) {
        sum.round_trip_ns += trips->first;
        sum.round_trips += trips->second;
      }
    }
  }
  std::vector<DeviceTiming> timings;
  for (size_t i = 0; i < lanes.size(); ++i) {
    if (lanes[i].clock != nullptr && lanes[i].remote != nullptr) lanes[i].remote->SetHopClock(nullptr).IgnoreError();
    const Sums& sum = sums[i];
    DeviceTiming t;
    if (sum.round_trips == static_cast<int64_t>(reps) * (layers - warm)) {
      t.round_trip_us = sum.round_trip_ns * 1e-3 / sum.round_trips;
    }
    t.per_layer_us = sum.total_ms * 1e3 / (reps * layers);
    t.steady_us = sum.steady_ms * 1e3 / (reps * (layers - warm));
    t.start_us = (sum.total_ms - sum.steady_ms) * 1e3 / reps - warm * t.steady_us;
    timings.push_back(t);
  }
  return timings;
}

// One link's step alone.
DeviceTiming DeviceMicros(RemoteAttention& remote, const std::vector<DecodeEntry>& entries, const Buffers& b,
                          int64_t layers, int reps, bool queued, cudaStream_t stream, bench::HopClock* clock = nullptr,
                          int64_t slice_us = 0) {
  return DeviceMicros({{&remote, &entries, &b, stream, clock}}, layers, reps, queued, b.gate.as<uint64_t>(),
                      slice_us)[0];
}

// The memory node's own work for the same step with nothing moving: its k/v store and attention
// (StoreKv + DecodeAttention, the unlinked kernels) on GPU `device`, in this process; microseconds
// per layer from GPU events around `layers` queued layers. What a round trip takes beyond this is
// the data plane's.
double AttentionAloneMicros(int device, int64_t batch, int64_t context, int64_t layers, uint64_t* gate) {
  namespace kc = kernels::cuda;
  cudaSetDevice(device);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const kc::AttentionShape shape{kQHeads, kKvHeads, kHeadDim, 0};
  const kc::DecodePlan plan = kc::PlanDecode(shape, batch, context, sms);
  const int64_t slots = batch * context;
  std::vector<int32_t> ids(slots), begin(batch + 1), write(batch);
  for (int64_t i = 0; i < slots; ++i) ids[i] = static_cast<int32_t>(i);
  for (int64_t s = 0; s <= batch; ++s) begin[s] = static_cast<int32_t>(s * context);
  for (int64_t s = 0; s < batch; ++s) write[s] = static_cast<int32_t>((s + 1) * context - 1);
  auto k = cuda::DeviceBuffer::Create(slots * kKv * sizeof(kc::bf16));
  auto v = cuda::DeviceBuffer::Create(slots * kKv * sizeof(kc::bf16));
  auto qkv = cuda::DeviceBuffer::Create(batch * kQkv * sizeof(float));
  auto out = cuda::DeviceBuffer::Create(batch * kQ * sizeof(float));
  auto work = cuda::DeviceBuffer::Create(std::max<int64_t>(1, plan.workspace_floats) * sizeof(float));
  auto lists = cuda::DeviceBuffer::Create((slots + 2 * batch + 1) * sizeof(int32_t));
  auto start = cuda::Event::Create(), end = cuda::Event::Create();
  if (!k.ok() || !v.ok() || !qkv.ok() || !out.ok() || !work.ok() || !lists.ok() || !start.ok() || !end.ok()) {
    cudaSetDevice(0);
    return -1;
  }
  // Rows of values as a layer's (not zeros: see kc::FillUniform).
  if (!kc::FillUniform(k->as<kc::bf16>(), slots * kKv, 1.f, 2, nullptr).ok() ||
      !kc::FillUniform(v->as<kc::bf16>(), slots * kKv, 1.f, 3, nullptr).ok() ||
      !kc::FillUniform(qkv->as<float>(), batch * kQkv, 1.f, 1, nullptr).ok()) {
    cudaSetDevice(0);
    return -1;
  }
  int32_t* d_ids = lists->as<int32_t>();
  int32_t* d_begin = d_ids + slots;
  int32_t* d_write = d_begin + batch + 1;
  cudaMemcpy(d_ids, ids.data(), slots * sizeof(int32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(d_begin, begin.data(), (batch + 1) * sizeof(int32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(d_write, write.data(), batch * sizeof(int32_t), cudaMemcpyHostToDevice);
  const float* rows = qkv->as<float>();
  double best = -1;
  for (int rep = 0; rep < 4; ++rep) {
    __atomic_store_n(gate, 0, __ATOMIC_RELEASE);
    uint32_t* gate_error = reinterpret_cast<uint32_t*>(gate + 1);
    *gate_error = 0;
    kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, nullptr).IgnoreError();
    start->Record(nullptr).IgnoreError();
    for (int64_t layer = 0; layer < layers; ++layer) {
      kc::StoreKv(rows + kQ, rows + kQ + kKv, kQkv, d_write, k->as<kc::bf16>(), v->as<kc::bf16>(), batch, kKv, nullptr)
          .IgnoreError();
      kc::DecodeAttention(shape, plan, rows, kQkv, k->as<kc::bf16>(), v->as<kc::bf16>(), d_ids, d_begin,
                          out->as<float>(), kQ, batch, work->as<float>(), nullptr)
          .IgnoreError();
    }
    end->Record(nullptr).IgnoreError();
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    cudaEventSynchronize(end->get());
    const double us = *end->ElapsedSince(*start) * 1e3 / layers;
    if (rep > 0 && (best < 0 || us < best)) best = us;  // the first is a warm-up
  }
  cudaSetDevice(0);
  return best;
}

// --lanes N: N links as compute nodes open them (packets where the GPUs are joined by NVLink,
// chunks of at least --chunk-rows), on N streams of GPU 0, each stepping through its own
// batch: first each alone, then all at once, as the batches of a rotating cluster's compute nodes
// do; the memory node serves a lane a link, which share its budget of polling blocks
// (kv/attention/spin_budget.h). Prints each lane's round trip on its hop clock.
int LanesAtOnce(const Options& o, Transport* tcp, const std::string& address, double rate) {
  const AttentionWireShape shape{o.layers, kQ, kKv, o.output_parts};
  int64_t max_batch = 0;
  for (int64_t b : o.batches) max_batch = std::max(max_batch, b);
  RemoteAttention over_tcp(tcp, {{"m", address}}, shape);  // reserves and frees the sequences
  struct Lane {
    std::unique_ptr<RemoteAttention> remote;
    Buffers b;
    cuda::Stream stream;
    bench::HopClock clock;
    std::vector<DecodeEntry> entries;
  };
  std::vector<Lane> lanes;
  for (int64_t i = 0; i < o.lanes; ++i) {
    auto remote = std::make_unique<RemoteAttention>(tcp, std::map<std::string, std::string>{{"m", address}}, shape);
    remote->set_line_rows(kDefaultLineRows);
    remote->set_packet_rows(kDefaultPacketRows);
    remote->EnableDeviceLinks(0, max_batch, {{"m", {"cuda_ipc"}}}, kMaxDataPlaneChunks, o.chunk_rows);
    absl::StatusOr<cuda::Stream> stream = cuda::Stream::Create();
    absl::StatusOr<bench::HopClock> clock = bench::HopClock::Create(o.layers);
    if (!stream.ok() || !clock.ok()) return 1;
    Lane lane{std::move(remote), Buffers{}, std::move(*stream), std::move(*clock), {}};
    if (!cuda::EnsureCapacity(&lane.b.qkv, max_batch * kQkv * sizeof(float)).ok() ||
        !cuda::EnsureCapacity(&lane.b.out, max_batch * kQ * sizeof(float)).ok() ||
        !cuda::EnsureCapacity(&lane.b.gate, 2 * sizeof(uint64_t)).ok() ||
        !kernels::cuda::FillUniform(lane.b.qkv.as<float>(), max_batch * kQkv, 1.f, 1 + i, nullptr).ok()) {
      return 1;
    }
    lanes.push_back(std::move(lane));
  }
  uint64_t* gate = lanes[0].b.gate.as<uint64_t>();
  // The slice's kernel loaded now, as in Compute: loaded at its first launch, it would wait behind
  // the step's kernels held by their gate.
  if ((o.slice_us > 0 || o.stagger_ns > 0 || o.beside_ns > 0) &&
      (!bench::QueueBusyWait(0, lanes[0].stream.get()).ok() || !lanes[0].stream.Synchronize().ok())) {
    return 1;
  }
  SequenceId next = 1;
  for (int64_t context : o.contexts) {
    std::printf("context %lld: the round trip on each lane's hop clock, us (lane 0, 1, ...)\n",
                static_cast<long long>(context));
    std::printf("%6s %8s %22s %22s %10s %10s", "batch", "target", "each alone", "all at once", "alone/tgt",
                "once/tgt");
    if (o.stagger_ns > 0) std::printf(" %22s %10s", "staggered", "stag/tgt");
    if (o.beside_ns > 0) std::printf(" %8s %10s", "beside", "bes/tgt");
    std::printf("\n");
    for (int64_t batch : o.batches) {
      std::vector<Reservation> reservations;
      std::vector<LaneStep> steps;
      for (Lane& lane : lanes) {
        lane.entries.clear();
        for (int64_t i = 0; i < batch; ++i, ++next) {
          lane.entries.push_back({next, static_cast<int32_t>(context - 1)});
          reservations.push_back({next, static_cast<int32_t>(context)});
          over_tcp.Assign(next, "m").IgnoreError();
          lane.remote->Assign(next, "m").IgnoreError();
        }
        steps.push_back({lane.remote.get(), &lane.entries, &lane.b, lane.stream.get(), &lane.clock});
      }
      if (!over_tcp.Reserve(reservations).ok()) {
        std::fprintf(stderr, "reserve failed at batch %lld\n", static_cast<long long>(batch));
        return 1;
      }
      const int reps = batch >= 256 ? 3 : 10;
      // Each lane's round trips, and the slowest (-1 where one was not timed).
      struct Trips {
        std::string text;
        double worst = 0;
        void Add(double us) {
          absl::StrAppend(&text, text.empty() ? "" : " ", absl::StrFormat("%.1f", us));
          worst = us < 0 || worst < 0 ? -1 : std::max(worst, us);
        }
      };
      Trips alone, together, staggered;
      for (const LaneStep& step : steps) {
        alone.Add(DeviceMicros({step}, o.layers, reps, true, gate, o.slice_us)[0].round_trip_us);
      }
      for (const DeviceTiming& t : DeviceMicros(steps, o.layers, reps, true, gate, o.slice_us)) {
        together.Add(t.round_trip_us);
      }
      Trips beside;
      if (o.beside_ns > 0) {
        std::vector<LaneStep> busy = steps;
        for (size_t i = 1; i < busy.size(); ++i) {
          busy[i] = {nullptr, nullptr, nullptr, steps[i].stream, nullptr, 0, o.beside_ns};
        }
        beside.Add(DeviceMicros(busy, o.layers, reps, true, gate, o.slice_us)[0].round_trip_us);
      }
      if (o.stagger_ns > 0) {
        for (size_t i = 0; i < steps.size(); ++i) steps[i].start_after_ns = static_cast<int64_t>(i) * o.stagger_ns;
        for (const DeviceTiming& t : DeviceMicros(steps, o.layers, reps, true, gate, o.slice_us)) {
          staggered.Add(t.round_trip_us);
        }
      }
      const double bytes = static_cast<double>(batch) * (kQkv + kQ) * sizeof(float);
      const double target = 5.0 + bytes / (rate * 1e9) * 1e6;
      std::printf("%6lld %8.1f %22s %22s %10.2f %10.2f", static_cast<long long>(batch), target, alone.text.c_str(),
                  together.text.c_str(), alone.worst / target, together.worst / target);
      if (o.stagger_ns > 0) std::printf(" %22s %10.2f", staggered.text.c_str(), staggered.worst / target);
      if (o.beside_ns > 0) std::printf(" %8s %10.2f", beside.text.c_str(), beside.worst / target);
      std::printf("\n");
      std::fflush(stdout);
      for (const Lane& lane : lanes) {
        for (const DecodeEntry& e : lane.entries) over_tcp.Free(e.seq);
      }
    }
    std::printf("\n");
  }
  std::printf(
      "each alone: a lane's step with the other links open and idle; all at once: every lane's step\n"
      "queued together, their layers in turn. alone/tgt, once/tgt: the slowest lane's round trip over\n"
      "the target, 5 us + both ways' bytes at the link rate (-1: a round trip was not timed). With\n"
      "--stagger-ns N, staggered: all at once again, lane i's GPU work starting i * N ns after the\n"
      "others' (a rotating cluster's batches take turns rather than meet at every hop). With\n"
      "--beside-ns N, beside: lane 0's step with the other lanes' streams busy-waiting N ns a layer.\n");
  return 0;
}

int Compute(const Options& o, const std::string& address) {
  const int gpus = GpuCount();
  if (gpus < 2) {
    // Both processes' kernels would share one GPU, which CUDA time-slices between their contexts:
    // every cuda_ipc figure came out at 4.4 ms a layer whatever the rows (tests/bench/RESULTS.md,
    // "Both ends on one GPU").
    std::fprintf(stderr,
                 "lamina-bench-data-plane needs two GPUs (found %d): two processes on one GPU take turns, so the\n"
                 "round trip would time the turns. On one GPU, lamina-bench-hop times the hop's kernels with both\n"
                 "ends in one process.\n",
                 gpus);
    return 2;
  }
  const int peer = 1;
  const double rate = PeerCopyRate(peer, size_t{256} << 20);
  cudaSetDevice(0);
  std::printf("data plane: compute end on GPU 0, memory end on GPU %d (another process); %lld layers of\n", peer,
              static_cast<long long>(o.layers));
  std::printf("Llama-3-8B shape, float32 rows (%lld floats out, %lld back per sequence)\n",
              static_cast<long long>(kQkv), static_cast<long long>(kQ));
  std::printf("baseline, same run: GPU 0 -> GPU %d copy of 256 MiB at %.1f GB/s\n", peer, rate);
  const double sm_rate = SendRowsRate(peer, 1024);
  const double same_bytes_rate = PeerCopyRate(peer, static_cast<size_t>(1024 * kQkv) * sizeof(float));
  std::printf("SendRows (SM copy) of 1024 q/k/v rows (24 MiB) GPU 0 -> GPU %d: %.1f GB/s, %.2f of the copy engine on\n"
              "the same 24 MiB (%.1f GB/s), %.2f of the link rate\n\n",
              peer, sm_rate, same_bytes_rate > 0 ? sm_rate / same_bytes_rate : 0.0, same_bytes_rate,
              rate > 0 ? sm_rate / rate : 0.0);
  std::unique_ptr<Transport> tcp = MakeTcpTransport();
  if (o.lanes > 1) return LanesAtOnce(o, tcp.get(), address, rate);
  const AttentionWireShape shape{o.layers, kQ, kKv, o.output_parts};
  int64_t max_batch = 0;
  for (int64_t b : o.batches) max_batch = std::max(max_batch, b);
  RemoteAttention over_tcp(tcp.get(), {{"m", address}}, shape);
  RemoteAttention one_chunk(tcp.get(), {{"m", address}}, shape);
  RemoteAttention as_lines(tcp.get(), {{"m", address}}, shape);
  RemoteAttention as_packets(tcp.get(), {{"m", address}}, shape);
  std::vector<std::unique_ptr<RemoteAttention>> chunked;
  for (int64_t n : o.chunks) {
    chunked.push_back(std::make_unique<RemoteAttention>(tcp.get(), std::map<std::string, std::string>{{"m", address}},
                                                        shape));
    chunked.back()->set_line_rows(kDefaultLineRows);  // as compute nodes do by default
    chunked.back()->set_packet_rows(kDefaultPacketRows);
    chunked.back()->EnableDeviceLinks(0, max_batch, {{"m", {"cuda_ipc"}}}, static_cast<int>(n), o.chunk_rows);
  }
  RemoteAttention over_nccl(tcp.get(), {{"m", address}}, shape);
  one_chunk.EnableDeviceLinks(0, max_batch, {{"m", {"cuda_ipc"}}}, 1);
  one_chunk.set_line_rows(0);
  as_lines.EnableDeviceLinks(0, max_batch, {{"m", {"cuda_ipc"}}}, 1);
  as_lines.set_line_rows(kernels::cuda::ReceiveRowsMaxCount());
  as_packets.EnableDeviceLinks(0, max_batch, {{"m", {"cuda_ipc"}}}, 1);
  as_packets.set_line_rows(0);
  as_packets.set_packet_rows(max_batch);
  over_nccl.EnableDeviceLinks(0, max_batch, {{"m", {"nccl"}}}, 1);
  auto stream = cuda::Stream::Create();
  Buffers b;
  if (!stream.ok()) return 1;
  if (!cuda::EnsureCapacity(&b.qkv, max_batch * kQkv * sizeof(float)).ok() ||
      !cuda::EnsureCapacity(&b.out, max_batch * kQ * sizeof(float)).ok() ||
      !cuda::EnsureCapacity(&b.host_qkv, max_batch * kQkv * sizeof(float)).ok() ||
      !cuda::EnsureCapacity(&b.host_out, max_batch * kQ * sizeof(float)).ok() ||
      !cuda::EnsureCapacity(&b.gate, 2 * sizeof(uint64_t)).ok()) {
    return 1;
  }
  absl::StatusOr<bench::HopClock> hop_clock = bench::HopClock::Create(o.layers);
  if (!hop_clock.ok()) return 1;
  bench::HopClock& clock = *hop_clock;
  // q/k/v rows of values as a layer's: all-zero rows would send the memory node's output
  // divisions down their slow path, a cost real rows never pay (kc::FillUniform).
  if (!kernels::cuda::FillUniform(b.qkv.as<float>(), max_batch * kQkv, 1.f, 1, nullptr).ok()) return 1;
  // The slice's kernel loaded now: CUDA loads a kernel at its first launch, which would wait behind
  // a step's queued kernels (held by their gate) and time the step out.
  if (o.slice_us > 0 && (!bench::QueueBusyWait(0, stream->get()).ok() || !stream->Synchronize().ok())) return 1;
  SequenceId next = 1;
  for (int64_t context : o.contexts) {
    std::printf("context %lld: microseconds per layer (the memory node's store and attention included)\n",
                static_cast<long long>(context));
    std::printf("%6s %9s %9s %9s %9s %9s %9s", "batch", "KiB", "tcp", "ipc paced", "ipc 1", "ipc lines", "ipc pkts");
    for (int64_t n : o.chunks) std::printf(" %9s", absl::StrCat("ipc ", n, " ch").c_str());
    std::printf(" %9s %9s %8s %8s %8s %8s %8s %10s %8s %8s %8s %8s\n", "start", "nccl", "target", "ipc/tgt", "link use",
                "nccl use", "hidden", "attn alone", "rt 1", "rt lines", "rt pkts", "rt/tgt");
    for (int64_t batch : o.batches) {
      std::vector<DecodeEntry> entries;
      std::vector<Reservation> reservations;
      for (int64_t i = 0; i < batch; ++i) {
        entries.push_back({next, static_cast<int32_t>(context - 1)});
        reservations.push_back({next, static_cast<int32_t>(context)});
        for (RemoteAttention* r : {&over_tcp, &one_chunk, &as_lines, &as_packets, &over_nccl}) {
          r->Assign(next, "m").IgnoreError();
        }
        for (auto& r : chunked) r->Assign(next, "m").IgnoreError();
        ++next;
      }
      if (!over_tcp.Reserve(reservations).ok()) {
        std::fprintf(stderr, "reserve failed at batch %lld\n", static_cast<long long>(batch));
        return 1;
      }
      const int reps = batch >= 256 ? 3 : 10;
      const double t_tcp = TcpMicros(over_tcp, entries, b, o.layers, reps);
      // With --packets-only, only as_packets opens a link.
      const bool all = !o.packets_only;
      const DeviceTiming paced =
          all ? DeviceMicros(one_chunk, entries, b, o.layers, reps, false, stream->get()) : DeviceTiming{};
      // Each cuda_ipc column runs twice: timed by events, then again for its round trip on the hop
      // clock, so that the clock's stamps are not in the periods.
      double best_round_trip = -1;  // the best cuda_ipc round trip on the hop clock
      const auto round_trip = [&](RemoteAttention& r) {
        const double us =
            DeviceMicros(r, entries, b, o.layers, reps, true, stream->get(), &clock, o.slice_us).round_trip_us;
        if (us > 0 && (best_round_trip < 0 || us < best_round_trip)) best_round_trip = us;
        return us;
      };
      const DeviceTiming one =
          all ? DeviceMicros(one_chunk, entries, b, o.layers, reps, true, stream->get()) : DeviceTiming{};
      const double one_round_trip = all ? round_trip(one_chunk) : -1;
      const bool lines_apply = all && batch <= kernels::cuda::ReceiveRowsMaxCount();
      const DeviceTiming lines =
          lines_apply ? DeviceMicros(as_lines, entries, b, o.layers, reps, true, stream->get()) : DeviceTiming{};
      const double lines_round_trip = lines_apply ? round_trip(as_lines) : -1;
      const DeviceTiming packets = DeviceMicros(as_packets, entries, b, o.layers, reps, true, stream->get());
      const double packets_round_trip = round_trip(as_packets);
      std::vector<double> chunked_us;
      double split_us = one.steady_us;  // the best chunked time that ran (-1: failed)
      for (auto& r : chunked) {
        chunked_us.push_back(DeviceMicros(*r, entries, b, o.layers, reps, true, stream->get()).steady_us);
        round_trip(*r);
        if (chunked_us.back() > 0 && (split_us < 0 || chunked_us.back() < split_us)) split_us = chunked_us.back();
      }
      const DeviceTiming over =
          all ? DeviceMicros(over_nccl, entries, b, o.layers, reps, true, stream->get()) : DeviceTiming{};
      const double bytes = static_cast<double>(batch) * (kQkv + kQ) * sizeof(float);
      const double transfer_us = bytes / (rate * 1e9) * 1e6;
      const double target = 5.0 + transfer_us;
      double best = split_us;
      if (lines.steady_us > 0 && (best < 0 || lines.steady_us < best)) best = lines.steady_us;
      if (packets.steady_us > 0 && (best < 0 || packets.steady_us < best)) best = packets.steady_us;
      const double alone = AttentionAloneMicros(peer, batch, context, o.layers, b.gate.as<uint64_t>());
      std::printf("%6lld %9.0f %9.1f %9.1f %9.1f %9.1f %9.1f", static_cast<long long>(batch), bytes / 1024, t_tcp,
                  paced.steady_us, one.steady_us, lines.steady_us, packets.steady_us);
      for (double us : chunked_us) std::printf(" %9.1f", us);
      std::printf(" %9.1f %9.1f %8.1f %8.2f %8.2f %8.2f %8.2f %10.1f %8.1f %8.1f %8.1f %8.2f\n", one.start_us,
                  over.steady_us, target, best / target, transfer_us / best, transfer_us / over.steady_us,
                  (one.steady_us - split_us) / transfer_us, alone, one_round_trip, lines_round_trip,
                  packets_round_trip, best_round_trip / target);
      std::fflush(stdout);
      for (const DecodeEntry& e : entries) over_tcp.Free(e.seq);
    }
    std::printf("\n");
  }
  std::printf(
      "Per layer, in the steady state (the last three quarters of the layers). ipc paced: cuda_ipc in\n"
      "one chunk, the compute stream running as the host queues it; ipc 1 and N ch (a layer in one\n"
      "chunk of rows behind a flag, or up to N of at least 32 rows, as packets where the GPUs are\n"
      "joined by NVLink and else up to 32 rows as lines, as compute nodes send them), ipc lines (one chunk as\n"
      "lines, up to 32 rows; -1 above), ipc pkts (one chunk as packets, where the GPUs are joined by\n"
      "NVLink; rows behind a flag elsewhere), nccl and attn alone: queued, the stream held until\n"
      "both ends have queued the whole step, so the GPUs' time alone. start: what a queued step's first\n"
      "layers take beyond the steady rate, per step. ipc/tgt: the best queued cuda_ipc time over 5 us +\n"
      "bytes / link rate (target <= 1); link use: bytes / time / link rate, cuda_ipc's best and nccl's\n"
      "(target >= 0.8 at batch 1024); hidden: the share of the transfer time that chunking (the best of\n"
      "the N ch columns) hid behind attention; attn alone: the memory node's k/v store and attention for\n"
      "the step with nothing moving (the same kernels, unlinked, on its GPU). rt 1, rt lines, rt pkts: the\n"
      "round trip alone, from the send's start to the outputs in place, on the compute GPU's clock (the\n"
      "mean of the steady layers; the period above also holds the compute end's turn between layers;\n"
      "with --slice-us, the compute end busy that long before each send, as a compute node's slices);\n"
      "rt/tgt: the best of them and of the chunked columns' over the target. With --packets-only, the\n"
      "columns but tcp and ipc pkts are -1, and the memory node serves one lane.\n");
  if (clock.step_ns() > 0) {
    std::printf("hop clock: every round trip timed was a multiple of %llu ns\n",
                static_cast<unsigned long long>(clock.step_ns()));
  }
  return 0;
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) {
  lamina::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--layers") {
      o.layers = std::stoll(value);
    } else if (flag == "--contexts") {
      o.contexts = lamina::ParseList(value);
    } else if (flag == "--batches") {
      o.batches = lamina::ParseList(value);
    } else if (flag == "--chunks") {
      o.chunks = lamina::ParseList(value);
    } else if (flag == "--chunk-rows") {
      o.chunk_rows = std::stoll(value);
    } else if (flag == "--output-parts") {
      o.output_parts = std::stoll(value);
    } else if (flag == "--slice-us") {
      o.slice_us = std::stoll(value);
    } else if (flag == "--packets-only") {
      o.packets_only = std::stoll(value) != 0;
    } else if (flag == "--lanes") {
      o.lanes = std::stoll(value);
    } else if (flag == "--stagger-ns") {
      o.stagger_ns = std::stoll(value);
    } else if (flag == "--beside-ns") {
      o.beside_ns = std::stoll(value);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (o.packets_only) o.chunks.clear();
  int address_pipe[2], stop_pipe[2];
  if (pipe(address_pipe) != 0 || pipe(stop_pipe) != 0) return 1;
  std::fflush(nullptr);
  const pid_t child = fork();  // before any CUDA call: each process makes its own context
  if (child == 0) {
    close(address_pipe[0]);
    close(stop_pipe[1]);
    _exit(lamina::MemoryNode(o, address_pipe[1], stop_pipe[0]));
  }
  close(address_pipe[1]);
  close(stop_pipe[0]);
  std::string address;
  char c;
  while (read(address_pipe[0], &c, 1) == 1 && c != '\n') address.push_back(c);
  int rc = 1;
  if (address.empty()) {
    std::fprintf(stderr, "the memory node did not start\n");
  } else {
    rc = lamina::Compute(o, address);
  }
  close(stop_pipe[1]);
  int status;
  waitpid(child, &status, 0);
  return rc;
}
