// lamina-bench-link-echo: the device data plane's ways of moving a layer's rows between two GPUs,
// with nothing else on the path. The compute end (GPU 0) sends a batch's q/k/v rows and takes
// back a row of attention outputs for each; the memory end (GPU 1) echoes its q rows back as soon
// as they are in. Every layer is queued ahead on both ends, as a step's layers are over cuda_ipc,
// and held behind a gate until all are queued. Three ways, each a layer's kernels on both ends:
//   rows (the baseline): SendRows then a flag, the peer's WaitFlag ahead; back the same, received
//        with ReceiveRows (up to 32 rows) or WaitFlag and ScatterRows;
//   lines (up to 32 rows): SendLines, ReceiveLines, 16-byte lines with two tags (line.h);
//   packets: SendPackets, ReceivePackets, 128-byte packets with one tag (packets.h).
// Microseconds a layer in the steady state (from the end of the first quarter of the layers to the
// end), best of 5; ratios against rows; and the target of issue 6 for a round trip, 5 us + the
// bytes both ways at the peer-copy rate measured in the same run. A layer's period also holds the
// compute end's turn between layers (its receive ending, the next send starting); the rt columns
// time the round trip alone on the compute GPU's clock, from the send's start to the outputs in
// place (the hop clock, kernels/cuda/data_plane.h), the steady layers' mean, best of 5, in runs of
// their own. With one GPU both ends share it.
// Llama-3-8B's layer shape (32 q heads, 8 kv heads, head_dim 128), float32 rows.
//
//   lamina-bench-link-echo [--layers 256] [--batches 1,8,16,32,64,128,256,512,1024]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/packets.h"
#include "tests/bench/gpu_timing.h"
#include "tests/bench/hop_clock.h"

namespace lamina::bench {
namespace {

namespace kc = kernels::cuda;

constexpr int64_t kQ = 32 * 128, kKv = 8 * 128, kQkv = kQ + 2 * kKv;
constexpr int64_t kTimeoutNs = 2'000'000'000;

enum class Way { kRows, kLines, kPackets };

// One batch's buffers: the compute end's on GPU 0, the memory end's on `peer`.
struct Echo {
  static absl::StatusOr<Echo> Create(int64_t batch, int peer);
  // `clock`: stamps each layer's round trip on the compute end (null: not timed).
  absl::Status Queue(Way way, int64_t layers, uint32_t* tag, const cuda::Event& mid, const cuda::Event& end,
                     cudaStream_t compute, cudaStream_t memory, uint64_t* gate, HopClock* clock) const;

  int64_t batch = 0;
  // Compute end (GPU 0).
  cuda::DeviceBuffer qkv;          // [batch, kQkv], sent
  cuda::DeviceBuffer out;          // [batch, kQ], received
  cuda::DeviceBuffer received;     // [batch, kQ], rows the memory end writes
  cuda::DeviceBuffer out_lines;    // mirrors [batch, kQ]
  cuda::DeviceBuffer out_packets;  // [batch, PacketsPerRow(kQ)]
  cuda::DeviceBuffer compute_words;  // done (uint64), arrivals (uint32)
  // Memory end (peer).
  cuda::DeviceBuffer mirror;      // [batch, kQkv]
  cuda::DeviceBuffer in_lines;    // mirrors [batch, kQkv]
  cuda::DeviceBuffer in_packets;  // [batch, PacketsPerRow(kQkv)]
  cuda::DeviceBuffer memory_words;  // ready (uint64), arrivals (uint32)
  // Each end's error word (uint32), on its own GPU as a link's is (common/cuda/error_word.h).
  cuda::DeviceBuffer compute_error, memory_error;

  // The error words' codes, or'ed (0: no wait gave up).
  absl::StatusOr<uint32_t> Errors() const {
    uint32_t words[2];
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&words[0], compute_error.data(), sizeof(uint32_t), cudaMemcpyDeviceToHost));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&words[1], memory_error.data(), sizeof(uint32_t), cudaMemcpyDeviceToHost));
    return words[0] | words[1];
  }
};

absl::StatusOr<Echo> Echo::Create(int64_t batch, int peer) {
  Echo e;
  e.batch = batch;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  LAMINA_ASSIGN_OR_RETURN(e.qkv, cuda::DeviceBuffer::CreateZeroed(batch * kQkv * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(e.out, cuda::DeviceBuffer::CreateZeroed(batch * kQ * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(e.received, cuda::DeviceBuffer::CreateZeroed(batch * kQ * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(e.out_lines, cuda::DeviceBuffer::CreateZeroed(batch * kQ / 2 * sizeof(kc::Line)));
  LAMINA_ASSIGN_OR_RETURN(e.out_packets,
                          cuda::DeviceBuffer::CreateZeroed(batch * kc::PacketsPerRow(kQ) * sizeof(kc::Packet)));
  LAMINA_ASSIGN_OR_RETURN(e.compute_words, cuda::DeviceBuffer::CreateZeroed(2 * sizeof(uint64_t)));
  LAMINA_ASSIGN_OR_RETURN(e.compute_error, cuda::DeviceBuffer::CreateZeroed(sizeof(uint32_t)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(peer));
  LAMINA_ASSIGN_OR_RETURN(e.mirror, cuda::DeviceBuffer::CreateZeroed(batch * kQkv * sizeof(float)));
  LAMINA_ASSIGN_OR_RETURN(e.in_lines, cuda::DeviceBuffer::CreateZeroed(batch * kQkv / 2 * sizeof(kc::Line)));
  LAMINA_ASSIGN_OR_RETURN(e.in_packets,
                          cuda::DeviceBuffer::CreateZeroed(batch * kc::PacketsPerRow(kQkv) * sizeof(kc::Packet)));
  LAMINA_ASSIGN_OR_RETURN(e.memory_words, cuda::DeviceBuffer::CreateZeroed(2 * sizeof(uint64_t)));
  LAMINA_ASSIGN_OR_RETURN(e.memory_error, cuda::DeviceBuffer::CreateZeroed(sizeof(uint32_t)));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  return e;
}

absl::Status Echo::Queue(Way way, int64_t layers, uint32_t* tag, const cuda::Event& mid, const cuda::Event& end,
                         cudaStream_t compute, cudaStream_t memory, uint64_t* gate, HopClock* clock) const {
  uint32_t* gate_error = reinterpret_cast<uint32_t*>(gate + 1);
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, compute));
  LAMINA_RETURN_IF_ERROR(kc::WaitFlag(gate, 1, 5'000'000'000, gate_error, 1, memory));
  uint64_t* done = compute_words.as<uint64_t>();
  uint32_t* compute_arrivals = reinterpret_cast<uint32_t*>(done + 1);
  uint64_t* ready = memory_words.as<uint64_t>();
  uint32_t* memory_arrivals = reinterpret_cast<uint32_t*>(ready + 1);
  const int64_t in_per_row = kc::PacketsPerRow(kQkv), out_per_row = kc::PacketsPerRow(kQ);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const uint64_t value = ++*tag;
    const uint32_t line_tag = kc::LineTag(value);
    // The memory end: take the rows in, echo the q rows back.
    uint32_t* error_word = memory_error.as<uint32_t>();
    switch (way) {
      case Way::kRows:
        LAMINA_RETURN_IF_ERROR(kc::WaitFlag(ready, value, kTimeoutNs, error_word, 2, memory));
        LAMINA_RETURN_IF_ERROR(kc::SendRows(mirror.as<float>(), kQkv, nullptr, batch, kQ, received.as<float>(), kQ,
                                            done, value, error_word, memory_arrivals, memory));
        break;
      case Way::kLines:
        LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(in_lines.as<kc::Line>(), kQkv, line_tag, kTimeoutNs, error_word, 2,
                                                nullptr, batch, kQkv, mirror.as<float>(), kQkv, memory));
        LAMINA_RETURN_IF_ERROR(kc::SendLines(mirror.as<float>(), kQkv, nullptr, batch, kQ, out_lines.as<kc::Line>(), kQ,
                                             line_tag, error_word, memory));
        break;
      case Way::kPackets:
        LAMINA_RETURN_IF_ERROR(kc::ReceivePackets({in_packets.as<kc::Packet>(), in_per_row, line_tag, batch, kQkv},
                                                  {kTimeoutNs, error_word, 2}, {mirror.as<float>(), kQkv}, memory));
        LAMINA_RETURN_IF_ERROR(kc::SendPackets(mirror.as<float>(), kQkv, nullptr, batch, kQ,
                                               out_packets.as<kc::Packet>(), out_per_row, line_tag, error_word,
                                               memory));
        break;
    }
    if (layer == layers / 4) LAMINA_RETURN_IF_ERROR(mid.Record(compute));
    // The compute end: send, then take the outputs back.
    error_word = compute_error.as<uint32_t>();
    uint64_t* sent_at = clock != nullptr ? clock->sent_at(layer) : nullptr;
    uint64_t* back_at = clock != nullptr ? clock->back_at(layer) : nullptr;
    switch (way) {
      case Way::kRows:
        LAMINA_RETURN_IF_ERROR(kc::SendRows(qkv.as<float>(), kQkv, nullptr, batch, kQkv, mirror.as<float>(), kQkv,
                                            ready, value, error_word, compute_arrivals, compute, sent_at));
        if (batch <= kc::ReceiveRowsMaxCount()) {
          LAMINA_RETURN_IF_ERROR(kc::ReceiveRows(done, value, kTimeoutNs, error_word, 4, received.as<float>(), kQ,
                                                 nullptr, batch, kQ, out.as<float>(), kQ, compute, back_at));
        } else {
          LAMINA_RETURN_IF_ERROR(kc::WaitFlag(done, value, kTimeoutNs, error_word, 4, compute));
          LAMINA_RETURN_IF_ERROR(
              kc::ScatterRows(received.as<float>(), kQ, nullptr, batch, kQ, out.as<float>(), kQ, compute, back_at));
        }
        break;
      case Way::kLines:
        LAMINA_RETURN_IF_ERROR(kc::SendLines(qkv.as<float>(), kQkv, nullptr, batch, kQkv, in_lines.as<kc::Line>(), kQkv,
                                             line_tag, error_word, compute, sent_at));
        LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(out_lines.as<kc::Line>(), kQ, line_tag, kTimeoutNs, error_word, 4,
                                                nullptr, batch, kQ, out.as<float>(), kQ, compute, 0,
                                                kc::NextKernel::kStartsAtOnce, back_at));
        break;
      case Way::kPackets:
        LAMINA_RETURN_IF_ERROR(kc::SendPackets(qkv.as<float>(), kQkv, nullptr, batch, kQkv,
                                               in_packets.as<kc::Packet>(), in_per_row, line_tag, error_word, compute,
                                               sent_at));
        LAMINA_RETURN_IF_ERROR(kc::ReceivePackets({out_packets.as<kc::Packet>(), out_per_row, line_tag, batch, kQ},
                                                  {kTimeoutNs, error_word, 4}, {out.as<float>(), kQ}, compute,
                                                  {back_at}));
        break;
    }
  }
  return end.Record(compute);
}

struct Bench {
  cudaStream_t compute, memory;
  uint64_t* gate;
  uint32_t* tag;
  int64_t layers;
};

// Microseconds a layer in the steady state, best of `reps` after a warm-up; with `clock`, the
// steady layers' mean round trip on the hop clock instead. Checks that no wait gave up and that
// the last layer's outputs are the q rows sent.
absl::StatusOr<double> SteadyMicros(const Echo& echo, Way way, const Bench& b, const std::vector<float>& want,
                                    HopClock* clock, int reps = 5) {
  LAMINA_ASSIGN_OR_RETURN(cuda::Event mid, cuda::Event::Create());
  LAMINA_ASSIGN_OR_RETURN(cuda::Event end, cuda::Event::Create());
  double best = -1;
  for (int rep = -1; rep < reps; ++rep) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(echo.out.data(), 0, echo.batch * kQ * sizeof(float)));
    __atomic_store_n(b.gate, 0, __ATOMIC_RELEASE);
    *reinterpret_cast<uint32_t*>(b.gate + 1) = 0;
    if (clock != nullptr) LAMINA_RETURN_IF_ERROR(clock->Reset());
    const absl::Status queued = echo.Queue(way, b.layers, b.tag, mid, end, b.compute, b.memory, b.gate, clock);
    __atomic_store_n(b.gate, 1, __ATOMIC_RELEASE);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(b.compute));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(b.memory));
    LAMINA_RETURN_IF_ERROR(queued);
    LAMINA_ASSIGN_OR_RETURN(const uint32_t error, echo.Errors());
    if (error != 0 || *reinterpret_cast<uint32_t*>(b.gate + 1) != 0) {
      return absl::DeadlineExceededError(absl::StrCat("batch ", echo.batch, ": a wait gave up (error word ", error,
                                                      "): the two ends' kernels did not run side by side"));
    }
    std::vector<float> got(echo.batch * kQ);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(got.data(), echo.out.data(), got.size() * sizeof(float),
                                           cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < echo.batch; ++r) {
      for (int64_t c = 0; c < kQ; ++c) {
        if (got[r * kQ + c] != want[r * kQkv + c]) {
          return absl::DataLossError(absl::StrCat("batch ", echo.batch, ": output row ", r, ", column ", c, " is ",
                                                  got[r * kQ + c], ", not the ", want[r * kQkv + c], " sent"));
        }
      }
    }
    double us = 0;
    if (clock != nullptr) {
      LAMINA_ASSIGN_OR_RETURN(const auto sum, clock->Sum(b.layers / 4));
      if (sum.second == 0) return absl::InternalError(absl::StrCat("batch ", echo.batch, ": a layer was not timed"));
      us = sum.first * 1e-3 / sum.second;
    } else {
      LAMINA_ASSIGN_OR_RETURN(const float ms, end.ElapsedSince(mid));
      const int64_t timed_layers = b.layers - b.layers / 4;  // the last three quarters are timed
      us = ms * 1e3 / static_cast<double>(timed_layers);
    }
    if (rep >= 0 && (best < 0 || us < best)) best = us;
  }
  return best;
}

// GB/s of a 256 MiB copy-engine copy from GPU 0 to `peer`, best of 5.
absl::StatusOr<double> PeerCopyRate(int peer) {
  const size_t bytes = size_t{256} << 20;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(peer));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer dst, cuda::DeviceBuffer::Create(bytes));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  LAMINA_ASSIGN_OR_RETURN(cuda::DeviceBuffer src, cuda::DeviceBuffer::Create(bytes));
  LAMINA_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create());
  LAMINA_ASSIGN_OR_RETURN(cuda::Event end, cuda::Event::Create());
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    LAMINA_RETURN_IF_ERROR(start.Record(nullptr));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(dst.data(), peer, src.data(), 0, bytes, nullptr));
    LAMINA_RETURN_IF_ERROR(end.Record(nullptr));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end.get()));
    LAMINA_ASSIGN_OR_RETURN(const float ms, end.ElapsedSince(start));
    best = std::max(best, bytes / (ms * 1e-3) / 1e9);
  }
  return best;
}

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"layers", "batches"}, {}));
  LAMINA_ASSIGN_OR_RETURN(const int64_t layers, flags.Int("layers", 256));
  if (layers < 8) return absl::InvalidArgumentError(absl::StrCat("--layers ", layers, ": at least 8"));
  LAMINA_ASSIGN_OR_RETURN(std::vector<int32_t> batches,
                          cli::ParseIdList("--batches", flags.String("batches", "1,8,16,32,64,128,256,512,1024")));
  for (const int32_t n : batches) {
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--batches: ", n, " (at least 1)"));
  }
  // Every kernel loaded now: a lazily loaded kernel's first launch may wait for the device to go
  // idle, which it never does while the other end's polls spin.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  int gpus = 0;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&gpus));
  const int peer = gpus > 1 ? 1 : 0;
  if (peer != 0) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(peer));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceEnablePeerAccess(0, 0));
    LAMINA_RETURN_IF_ERROR(kc::PreloadDataPlaneKernels());
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaDeviceEnablePeerAccess(peer, 0));
  }
  LAMINA_RETURN_IF_ERROR(kc::PreloadDataPlaneKernels());
  cudaDeviceProp prop;
  LAMINA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  LAMINA_ASSIGN_OR_RETURN(const double rate, PeerCopyRate(peer));
  std::printf("%s: compute end on GPU 0, memory end on GPU %d%s; %lld layers queued ahead\n", prop.name, peer,
              peer == 0 ? " (one GPU: both ends share it)" : "", static_cast<long long>(layers));
  std::printf("baseline: a 256 MiB copy GPU 0 -> GPU %d at %.1f GB/s; Llama-3-8B rows (q/k/v out, q back), float32\n",
              peer, rate);
  std::printf("us a layer, steady state, best of 5; target = 5 us + both ways' bytes at the copy rate;\n"
              "rt: the round trip alone on the compute GPU's clock (the period less the compute end's turn)\n\n");
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream compute, cuda::Stream::Create());
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(peer));
  LAMINA_ASSIGN_OR_RETURN(cuda::Stream memory, cuda::Stream::Create());
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  LAMINA_ASSIGN_OR_RETURN(cuda::PinnedBuffer gate_words, cuda::PinnedBuffer::Create(2 * sizeof(uint64_t)));
  LAMINA_ASSIGN_OR_RETURN(HopClock clock, HopClock::Create(layers));
  uint32_t tag = 0;
  const Bench bench{compute.get(), memory.get(), gate_words.as<uint64_t>(), &tag, layers};
  std::printf("%6s | %8s %8s %8s | %8s | %12s %12s %15s | %8s %8s %8s | %12s\n", "batch", "rows", "lines", "packets",
              "target", "lines÷rows", "packets÷rows", "packets÷target", "rt rows", "rt lines", "rt pkts",
              "rt pkts÷tgt");
  const auto text = [](double us) { return us < 0 ? std::string("-") : absl::StrCat(absl::SixDigits(us)); };
  for (const int32_t batch : batches) {
    LAMINA_ASSIGN_OR_RETURN(Echo echo, Echo::Create(batch, peer));
    std::vector<float> sent(batch * kQkv);
    for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<float>(i % 1000) * 0.25f - 100.f;
    LAMINA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(echo.qkv.data(), sent.data(), sent.size() * sizeof(float), cudaMemcpyHostToDevice));
    // A way's period, then its round trip on the hop clock: {period, round trip}, -1 where the way
    // does not take the batch.
    auto time = [&](Way way) -> absl::StatusOr<std::pair<double, double>> {
      if (way == Way::kLines && batch > kc::ReceiveRowsMaxCount()) return std::pair<double, double>{-1, -1};
      LAMINA_ASSIGN_OR_RETURN(const double period, SteadyMicros(echo, way, bench, sent, nullptr));
      LAMINA_ASSIGN_OR_RETURN(const double round_trip, SteadyMicros(echo, way, bench, sent, &clock));
      return std::pair<double, double>{period, round_trip};
    };
    LAMINA_ASSIGN_OR_RETURN(const auto rows, time(Way::kRows));
    LAMINA_ASSIGN_OR_RETURN(const auto lines, time(Way::kLines));
    LAMINA_ASSIGN_OR_RETURN(const auto packets, time(Way::kPackets));
    const double bytes = static_cast<double>(batch) * (kQkv + kQ) * sizeof(float);
    const double target = 5.0 + bytes / (rate * 1e3);
    std::printf("%6d | %8.2f %8s %8.2f | %8.2f | %12s %12.2f %15.2f | %8.2f %8s %8.2f | %12.2f\n", batch, rows.first,
                text(lines.first).c_str(), packets.first, target,
                text(lines.first < 0 ? -1 : lines.first / rows.first).c_str(),
                packets.first / rows.first, packets.first / target, rows.second, text(lines.second).c_str(),
                packets.second, packets.second / target);
  }
  if (clock.step_ns() > 0) {
    std::printf("hop clock: every round trip timed was a multiple of %llu ns\n",
                static_cast<unsigned long long>(clock.step_ns()));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace lamina::bench

int main(int argc, char** argv) {
  return lamina::bench::BenchMain("lamina-bench-link-echo", argc, argv, lamina::bench::Run);
}
