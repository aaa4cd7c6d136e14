// A GPU memory node's device-side decode step (AttentionExecutor::QueueDeviceDecode) against the
// CPU executor's host path: a step in which a sequence has several rows (a prompt continuing on
// the decode path, after an earlier chunk or a cached prefix) stores every row's k/v before any
// of its rows attends over them, its rows spread over chunks, and goes unlinked; a step of one row
// a sequence goes in linked launches. A prefill's store over a link writes the layers it lists,
// several prompts travelling in one transfer.
// Skips without a GPU.
#include <cuda_runtime_api.h>

#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "data_plane/device_link.h"
#include "gtest/gtest.h"
#include "kv/attention/attention_executor.h"
#include "tests/support/cuda_test_util.h"

namespace lamina {
namespace {

using cuda::DeviceBuffer;
using testing::Download;
using testing::Upload;

constexpr int64_t kLayers = 2, kQHeads = 4, kKvHeads = 2, kDim = 16;
constexpr int64_t kQ = kQHeads * kDim, kKv = kKvHeads * kDim, kRow = kQ + 2 * kKv;

// A memory end whose rows are in place before the step (every layer's the same, in received())
// and whose sends keep each layer's outputs: the link's part of a step without a peer. It offers a
// DirectHop (its ready flag already up) and counts how many chunks took it.
class LocalLink : public MemoryLinkEnd {
 public:
  LocalLink(const std::vector<float>& qkv, int64_t rows)
      : received_(Upload(qkv)),
        outputs_(Upload(std::vector<float>(kLayers * rows * kQ, NAN))),
        ready_(Upload(std::vector<uint64_t>{1})),
        done_(Upload(std::vector<uint64_t>{0})),
        error_(Upload(std::vector<uint32_t>{0})) {}

  std::string transport() const override { return "local"; }
  absl::Status QueueReceive(uint64_t, int64_t, int, int, int64_t, GpuStream) override { return absl::OkStatus(); }
  const float* received() const override { return received_.as<float>(); }
  absl::Status QueueSend(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows, const float* out,
                         int64_t out_stride, GpuStream stream) override {
    const RowRange r = ChunkOf(rows, chunks, chunk);
    if (r.count == 0) return absl::OkStatus();  // a store's send: a flag alone
    if (cudaMemcpy2DAsync(Outputs(layer, rows) + r.first * kQ, kQ * sizeof(float), out + r.first * out_stride,
                          out_stride * sizeof(float), kQ * sizeof(float), r.count, cudaMemcpyDeviceToDevice,
                          stream) != cudaSuccess) {
      return absl::InternalError("cudaMemcpy2DAsync");
    }
    return absl::OkStatus();
  }
  std::optional<DeviceHop> DirectHop(uint64_t step, int64_t layer, int chunk, int chunks, int64_t rows) override {
    ++direct_hops_;
    DeviceHop hop;
    hop.timeout_ns = 5'000'000'000;
    hop.error = error_.as<uint32_t>();
    hop.error_code = 1;
    hop.in = DeviceHop::FlagIn{ready_.as<uint64_t>(), 1};
    hop.out = DeviceHop::RowsOut{Outputs(layer, rows) + ChunkOf(rows, chunks, chunk).first * kQ, kQ,
                                 done_.as<uint64_t>(), step};
    return hop;
  }
  absl::Status TakeStepStatus() override {
    return Download<uint32_t>(error_.data(), 1)[0] == 0 ? absl::OkStatus() : absl::DeadlineExceededError("a wait");
  }

  std::vector<float> LayerOutputs(int64_t layer, int64_t rows) const {
    return Download<float>(Outputs(layer, rows), rows * kQ);
  }
  int direct_hops() const { return direct_hops_; }

 private:
  float* Outputs(int64_t layer, int64_t rows) const { return outputs_.as<float>() + layer * rows * kQ; }

  DeviceBuffer received_, outputs_, ready_, done_, error_;
  int direct_hops_ = 0;
};

// The step's attention outputs on a GPU executor (device-side, in `chunks`) and on a CPU one (the
// host path, bf16 pool: the same rounding of stored k/v), after the same prompts were stored in
// both; fails the test where they differ. Returns how many chunks took a DirectHop.
int ExpectDeviceStepMatchesHostPath(const std::vector<DecodeEntry>& entries, int chunks,
                                    const std::vector<int32_t>& prompt_lengths) {
  const AttentionExecutorOptions options{kLayers, 256, {kQHeads, kKvHeads, kDim, 0}, 0, DType::kBF16};
  AttentionExecutorOptions on_cpu = options;
  on_cpu.cuda_device = -1;
  auto gpu = AttentionExecutor::Create(options);
  auto cpu = AttentionExecutor::Create(on_cpu);
  EXPECT_TRUE(gpu.ok() && cpu.ok()) << gpu.status() << cpu.status();
  if (!gpu.ok() || !cpu.ok()) return -1;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  // Sequence s (1, 2, ...) has a prompt of prompt_lengths[s - 1] tokens, stored in both.
  for (size_t s = 0; s < prompt_lengths.size(); ++s) {
    const SequenceId seq = static_cast<SequenceId>(s + 1);
    const int32_t n = prompt_lengths[s];
    std::vector<float> k(n * kKv), v(n * kKv);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    for (AttentionExecutor* e : {gpu->get(), cpu->get()}) {
      EXPECT_TRUE(e->Reserve({{seq, n}}).ok());
      for (int64_t layer = 0; layer < kLayers; ++layer) {
        EXPECT_TRUE(e->StoreKv(layer, seq, 0, n, k.data(), v.data(), kKv).ok());
      }
    }
  }
  std::vector<Reservation> reservations;
  for (const DecodeEntry& e : entries) reservations.push_back({e.seq, e.position + 1});
  EXPECT_TRUE((*gpu)->Reserve(reservations).ok());
  EXPECT_TRUE((*cpu)->Reserve(reservations).ok());
  EXPECT_TRUE((*gpu)->FlushStores().ok());

  const int64_t rows = static_cast<int64_t>(entries.size());
  std::vector<float> qkv(rows * kRow);
  for (float& x : qkv) x = dist(rng);
  const QkvLayout layout{kRow, 0, kQ, kQ + kKv};
  std::vector<std::vector<float>> expected(kLayers, std::vector<float>(rows * kQ));
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    EXPECT_TRUE((*cpu)->Decode(layer, entries, qkv.data(), layout, expected[layer].data(), kQ).ok());
  }

  LocalLink link(qkv, rows);
  auto lane = (*gpu)->NewDeviceLane(chunks);
  EXPECT_TRUE(lane.ok()) << lane.status();
  if (!lane.ok()) return -1;
  EXPECT_TRUE((*gpu)->PrepareDeviceDecode(entries, chunks, lane->get()).ok());
  const absl::Status queued = AttentionExecutor::QueueDeviceDecode(
      7, options, rows, chunks, {}, AttentionExecutor::MayLink(entries), lane->get(), &link);
  EXPECT_TRUE(queued.ok()) << queued;
  const absl::Status finished = AttentionExecutor::FinishDeviceDecode(lane->get(), &link);
  EXPECT_TRUE(finished.ok()) << finished;
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const std::vector<float> got = link.LayerOutputs(layer, rows);
    for (int64_t i = 0; i < rows * kQ; ++i) {
      EXPECT_NEAR(got[i], expected[layer][i], 1e-4f) << "layer " << layer << ", row " << i / kQ << " (sequence "
                                                     << entries[i / kQ].seq << ", position "
                                                     << entries[i / kQ].position << "), float " << i % kQ;
    }
  }
  return link.direct_hops();
}

TEST(AttentionExecutorCudaTest, ASequenceInSeveralRowsIsStoredBeforeItsRowsAttendAndGoesUnlinked) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  // Sequence 1 continues its 5-token prompt with 6 rows, spread over the 3 chunks around sequence
  // 2's one row: each of its rows attends over the rows before it, stored in this step.
  const std::vector<DecodeEntry> entries = {{1, 5}, {1, 6}, {2, 3}, {1, 7}, {1, 8}, {1, 9}, {1, 10}};
  EXPECT_EQ(ExpectDeviceStepMatchesHostPath(entries, 3, {5, 3}), 0) << "a linked launch does not order the rows";
}

TEST(AttentionExecutorCudaTest, AStepOfOneRowASequenceGoesLinked) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const std::vector<DecodeEntry> entries = {{1, 5}, {2, 3}, {3, 1}, {4, 8}};
  EXPECT_EQ(ExpectDeviceStepMatchesHostPath(entries, 2, {5, 3, 1, 8}), kLayers * 2);
}

// A prefill's k/v over a link for some of the layers (a rotating compute node stores only those
// of its own slices), two prompts in one transfer (their rows follow each other in the batch):
// the listed layer gets each prompt's rows, the other keeps what it held. Read back through decode
// steps on the host path, against a CPU executor given the same stores.
TEST(AttentionExecutorCudaTest, AStoreOfSomeLayersWritesThoseAndLeavesTheOthers) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const AttentionExecutorOptions options{kLayers, 256, {kQHeads, kKvHeads, kDim, 0}, 0, DType::kBF16};
  AttentionExecutorOptions on_cpu = options;
  on_cpu.cuda_device = -1;
  auto gpu = AttentionExecutor::Create(options);
  auto cpu = AttentionExecutor::Create(on_cpu);
  ASSERT_TRUE(gpu.ok() && cpu.ok()) << gpu.status() << cpu.status();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto draw = [&](int64_t n) {
    std::vector<float> x(n);
    for (float& f : x) f = dist(rng);
    return x;
  };
  // Sequence 1 has a prompt of 6 tokens, sequence 2 of 3. Layer 0 holds their first k/v; the
  // store sends new ones, [9, k | v] (sequence 1's rows first), for layer 1 only.
  const std::vector<std::pair<SequenceId, int32_t>> prompts = {{1, 6}, {2, 3}};
  const int64_t rows = 9;
  const std::vector<float> kv1 = draw(rows * 2 * kKv);
  int64_t first_row = 0;
  for (const auto& [seq, n] : prompts) {
    const std::vector<float> k0 = draw(n * kKv), v0 = draw(n * kKv);
    for (AttentionExecutor* e : {gpu->get(), cpu->get()}) {
      ASSERT_TRUE(e->Reserve({{seq, n + 1}}).ok());
      ASSERT_TRUE(e->StoreKv(0, seq, 0, n, k0.data(), v0.data(), kKv).ok());
    }
    const float* mine = kv1.data() + first_row * 2 * kKv;
    ASSERT_TRUE((*cpu)->StoreKv(1, seq, 0, n, mine, mine + kKv, 2 * kKv).ok());
    first_row += n;
  }
  ASSERT_TRUE((*gpu)->FlushStores().ok());

  LocalLink link(kv1, 1);
  auto lane = (*gpu)->NewDeviceLane(1);
  ASSERT_TRUE(lane.ok()) << lane.status();
  const std::vector<AttentionExecutor::StorePiece> pieces = {{1, 0, 6, 0}, {2, 0, 3, 0}};
  ASSERT_TRUE((*gpu)->PrepareDeviceStore(pieces, lane->get()).ok());
  const absl::StatusOr<std::vector<int64_t>> transfers = AttentionExecutor::TransferRows(pieces);
  ASSERT_TRUE(transfers.ok()) << transfers.status();
  EXPECT_EQ(*transfers, std::vector<int64_t>{9});
  const std::vector<int64_t> layers = {1};
  const absl::Status queued =
      AttentionExecutor::QueueDeviceStore(3, options, *transfers, layers, lane->get(), &link);
  ASSERT_TRUE(queued.ok()) << queued;
  const absl::Status finished = AttentionExecutor::FinishDeviceDecode(lane->get(), &link);
  ASSERT_TRUE(finished.ok()) << finished;

  const std::vector<DecodeEntry> entries = {{1, 6}, {2, 3}};
  const std::vector<float> qkv = draw(2 * kRow);
  const QkvLayout layout{kRow, 0, kQ, kQ + kKv};
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    std::vector<float> got(2 * kQ), expected(2 * kQ);
    ASSERT_TRUE((*gpu)->Decode(layer, entries, qkv.data(), layout, got.data(), kQ).ok());
    ASSERT_TRUE((*cpu)->Decode(layer, entries, qkv.data(), layout, expected.data(), kQ).ok());
    for (int64_t i = 0; i < 2 * kQ; ++i) {
      EXPECT_NEAR(got[i], expected[i], 1e-4f) << "layer " << layer << ", sequence " << 1 + i / kQ << ", float "
                                              << i % kQ;
    }
  }
}

}  // namespace
}  // namespace lamina
