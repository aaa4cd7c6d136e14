// The conformance suite of the device links (data_plane/device_link.h): every
// transport this machine can run (cuda_ipc, nccl, rdma) passes the same cases. The compute end is
// in this process on GPU 0; the memory end is in a process of its own (device_link_peer.cc), as a
// memory node is, on GPU 1 (GPU 0 where there is only one; nccl skips there, and rdma skips where
// there is no RDMA device).
//   - Steps of picked batch rows, in one chunk or several, behind flags or as lines, arrive whole
//     and in order, layer by layer, and their outputs come back to their batch rows and nowhere
//     else: with the memory end's chunks through DirectHop where the link gives one, and through
//     QueueReceive and QueueSend alone (a memory node's step with a sequence in several rows).
//   - A wait for a peer that sends nothing gives up after the link's timeout: DeadlineExceeded.
//   - Abort ends either end's waits at once, long before the timeout: Unavailable.
//   - An offer that cannot be read is refused, naming the transport.
#include <signal.h>
#include <sys/wait.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "common/process/child_process.h"
#include "common/transport/transport.h"
#include "data_plane/device_link.h"
#include "gtest/gtest.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/data_plane/device_link_peer.h"

namespace lamina {
namespace {

using testing::DownloadFrom;
using testing::UploadTo;

// The memory end's GPU: another than the compute end's where there is one.
int PeerGpu() { return GpuNames().size() > 1 ? 1 : 0; }

// The suite's parameter: a transport, or cuda_ipc with packets ("cuda_ipc+packets").
std::string TransportOf(const std::string& param) { return param == "cuda_ipc+packets" ? "cuda_ipc" : param; }

// Rows of q 8, k 4 and v 4 floats; cuda_ipc sends chunks of up to 2 rows as lines, or with
// packets every chunk as packets (where the two GPUs are joined by NVLink or are one), the
// outputs in two parts a row.
LinkShape Shape(int64_t layers, int64_t max_rows, int max_chunks, absl::Duration timeout, const std::string& param) {
  LinkShape shape{layers, 16, 8, max_rows, max_chunks, timeout, TransportOf(param) == "cuda_ipc" ? 2 : 0};
  if (param == "cuda_ipc+packets") {
    shape.packet_rows = max_rows;
    shape.out_segments = 2;  // the outputs' packets in two parts a row, as a memory node's two kv heads' would be
  }
  return shape;
}

class DeviceLinkConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Opens a link of `shape`: the compute end here, the memory end in a peer process. Skips where
  // this machine cannot run the transport; callers return when IsSkipped() or a fatal failure.
  void Open(const LinkShape& shape) {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
    if (GetParam() == "nccl" && GpuNames().size() < 2) GTEST_SKIP() << "nccl joins two GPUs and this machine has one";
    shape_ = shape;
    auto compute = CreateComputeLinkEnd(TransportOf(GetParam()), shape, 0);
    if (absl::IsFailedPrecondition(compute.status())) GTEST_SKIP() << compute.status().message();
    ASSERT_TRUE(compute.ok()) << compute.status();
    compute_ = std::move(*compute);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto stream = cuda::Stream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = std::move(*stream);

    auto listener = tcp_->Listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(*listener);
    log_ = dir_.path() + "/peer.log";
    auto pid = SpawnLogged({LAMINA_DEVICE_LINK_PEER, listener_->address()}, log_);
    ASSERT_TRUE(pid.ok()) << pid.status();
    pid_ = *pid;
    auto peer = listener_->Accept(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(peer.ok()) << peer.status() << "\npeer's log:\n" << PeerLog();
    peer_ = std::move(*peer);

    std::vector<uint8_t> join;
    WireWriter w(&join);
    w.PutString(TransportOf(GetParam()));
    w.Put<int32_t>(PeerGpu());
    link_peer::PutShape(w, shape);
    w.PutString(compute_->Offer());
    ASSERT_TRUE(Request(link_peer::kJoin, join).ok());
    auto answer = AwaitReply(absl::Seconds(60));
    ASSERT_TRUE(answer.ok()) << answer.status() << "\npeer's log:\n" << PeerLog();
    ASSERT_TRUE(answer->status.ok()) << answer->status;
    const absl::Status accepted = compute_->Accept(answer->bytes);
    ASSERT_TRUE(accepted.ok()) << accepted;
  }

  // The peer quits and must exit by itself, cleanly, within 30 s.
  void TearDown() override {
    if (peer_ != nullptr) {
      Request(link_peer::kQuit, std::vector<uint8_t>()).IgnoreError();
      peer_->Close();
    }
    if (pid_ < 0) return;
    int status = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        ::kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        ADD_FAILURE() << "the peer did not exit within 30 s of kQuit\npeer's log:\n" << PeerLog();
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the peer ended with status " << status << "\npeer's log:\n"
        << PeerLog();
  }

  absl::Status Request(link_peer::Type type, const std::vector<uint8_t>& payload) {
    const ByteSpan parts[] = {ByteSpan(payload)};
    return peer_->Send({type, 0, 0}, parts);
  }

  absl::Status Request(link_peer::Type type, const link_peer::Step& step) {
    std::vector<uint8_t> payload;
    WireWriter w(&payload);
    link_peer::PutStep(w, step);
    return Request(type, payload);
  }

  absl::StatusOr<link_peer::Reply> AwaitReply(absl::Duration wait) {
    MessageHeader header;
    std::vector<uint8_t> payload;
    LAMINA_RETURN_IF_ERROR(peer_->Receive(&header, &payload, absl::Now() + wait));
    if (header.type != link_peer::kReply) return absl::InternalError(absl::StrCat("message ", header.type));
    WireReader r(payload.data(), payload.size());
    return link_peer::GetReply(r);
  }

  // Queues every layer of step `step` on the compute end, as a compute node does
  // (RemoteAttention::QueueDeviceDecode): a layer's chunks sent, then received.
  void QueueStep(uint64_t step, int chunks, const std::vector<cuda::DeviceBuffer>& qkv, int64_t qkv_stride,
                 const std::vector<cuda::DeviceBuffer>& out, int64_t out_stride) {
    for (int64_t layer = 0; layer < shape_.num_layers; ++layer) {
      for (int c = 0; c < chunks; ++c) {
        const absl::Status sent =
            compute_->QueueSend(step, layer, c, chunks, qkv[layer].as<float>(), qkv_stride, stream_.get());
        ASSERT_TRUE(sent.ok()) << sent;
      }
      for (int c = 0; c < chunks; ++c) {
        const absl::Status received =
            compute_->QueueReceive(step, layer, c, chunks, out[layer].as<float>(), out_stride, stream_.get());
        ASSERT_TRUE(received.ok()) << received;
      }
    }
  }

  std::string PeerLog() const { return TailOfFile(log_, 40, "\n"); }

  LinkShape shape_;
  std::unique_ptr<ComputeLinkEnd> compute_;
  cuda::Stream stream_;
  std::unique_ptr<Transport> tcp_ = MakeTcpTransport();
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Connection> peer_;
  pid_t pid_ = -1;
  testing::TempDir dir_;
  std::string log_;
};

// Buffers of `rows` rows of `stride` floats on GPU 0, one a layer, each holding `fill(layer)`.
template <typename Fill>
std::vector<cuda::DeviceBuffer> LayerBuffers(int64_t layers, Fill fill) {
  std::vector<cuda::DeviceBuffer> buffers;
  for (int64_t layer = 0; layer < layers; ++layer) buffers.push_back(UploadTo(0, fill(layer)));
  return buffers;
}

TEST_P(DeviceLinkConformanceTest, StepsOfPickedRowsArriveWholeAndInOrderAndOutputsReturnToTheirRows) {
  Open(Shape(3, 12, 3, absl::Seconds(20), GetParam()));
  if (IsSkipped() || HasFatalFailure()) return;
  // A batch of 12 rows, strides that are no multiple of anything.
  constexpr int64_t kBatch = 12, kStride = 17, kOutStride = 11;
  struct Case {
    std::vector<int32_t> rows;
    int chunks;
  };
  const std::vector<Case> cases = {
      {{5, 0, 7}, 1},                                 // one chunk behind a flag or as packets (lines take at most 2 rows)
      {{1}, 1},                                       // one row: lines over cuda_ipc, or packets
      {{11, 2, 9, 4, 6, 3, 8}, 3},                    // chunks of 3, 2 and 2 rows: a flag, then lines; or packets
      {{10, 3}, 2},                                   // a row a chunk
      {{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, 3},    // every row, backwards, 4 a chunk
  };
  uint64_t step = 0;
  for (const bool linked : {true, false}) {
    for (const Case& c : cases) {
      ++step;
      const int chunks = std::min(c.chunks, compute_->max_chunks());
      const int64_t rows = static_cast<int64_t>(c.rows.size());
      SCOPED_TRACE(absl::StrCat("step ", step, ": ", rows, " rows in ", chunks, " chunks", linked ? "" : ", unlinked"));
      // Each layer's q/k/v differ from every other's, so a layer's rows taken for another's show.
      auto qkv_of = [&](int64_t layer) {
        std::vector<float> qkv(kBatch * kStride);
        for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = step * 10000.f + layer * 1000.f + i + 0.5f;
        return qkv;
      };
      const std::vector<cuda::DeviceBuffer> qkv = LayerBuffers(shape_.num_layers, qkv_of);
      const std::vector<cuda::DeviceBuffer> out =
          LayerBuffers(shape_.num_layers, [&](int64_t) { return std::vector<float>(kBatch * kOutStride, -1.f); });
      ASSERT_TRUE(compute_->SetRows(c.rows).ok());
      ASSERT_TRUE(Request(link_peer::kServe, link_peer::Step{step, rows, chunks, linked}).ok());
      QueueStep(step, chunks, qkv, kStride, out, kOutStride);
      if (HasFatalFailure()) return;
      ASSERT_TRUE(stream_.Synchronize().ok());
      const absl::Status status = compute_->TakeStepStatus();
      EXPECT_TRUE(status.ok()) << status << "\npeer's log:\n" << PeerLog();
      auto reply = AwaitReply(absl::Seconds(60));
      ASSERT_TRUE(reply.ok()) << reply.status() << "\npeer's log:\n" << PeerLog();
      ASSERT_TRUE(reply->status.ok()) << reply->status;

      // The memory end got every picked row of every layer, whole and packed in the order given.
      ASSERT_EQ(reply->bytes.size(), shape_.num_layers * rows * shape_.qkv_size * sizeof(float));
      const float* received = reinterpret_cast<const float*>(reply->bytes.data());
      for (int64_t layer = 0; layer < shape_.num_layers; ++layer) {
        const std::vector<float> sent = qkv_of(layer);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t col = 0; col < shape_.qkv_size; ++col) {
            ASSERT_EQ(received[(layer * rows + i) * shape_.qkv_size + col], sent[c.rows[i] * kStride + col])
                << "layer " << layer << ", packed row " << i << ", float " << col;
          }
        }
      }
      // The outputs (each row's q) came back to the picked batch rows only.
      for (int64_t layer = 0; layer < shape_.num_layers; ++layer) {
        const std::vector<float> sent = qkv_of(layer);
        const std::vector<float> got = DownloadFrom<float>(0, out[layer].data(), kBatch * kOutStride);
        for (int64_t row = 0; row < kBatch; ++row) {
          const bool picked = std::find(c.rows.begin(), c.rows.end(), row) != c.rows.end();
          for (int64_t col = 0; col < kOutStride; ++col) {
            const float expected = picked && col < shape_.q_size ? sent[row * kStride + col] : -1.f;
            ASSERT_EQ(got[row * kOutStride + col], expected) << "layer " << layer << ", batch row " << row << ", float "
                                                             << col;
          }
        }
      }
    }
  }
}

TEST_P(DeviceLinkConformanceTest, AWaitForAPeerThatSendsNothingGivesUpAfterTheTimeout) {
  Open(Shape(2, 4, 1, absl::Milliseconds(500), GetParam()));
  if (IsSkipped() || HasFatalFailure()) return;
  const auto qkv = LayerBuffers(2, [](int64_t) { return std::vector<float>(4 * 16, 1.f); });
  const auto out = LayerBuffers(2, [](int64_t) { return std::vector<float>(4 * 8, 0.f); });
  ASSERT_TRUE(compute_->SetRows({0, 2, 3}).ok());
  const absl::Time start = absl::Now();
  QueueStep(1, 1, qkv, 16, out, 8);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(stream_.Synchronize().ok());
  const absl::Duration took = absl::Now() - start;
  const absl::Status status = compute_->TakeStepStatus();
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_NE(status.message().find(TransportOf(GetParam()) + ":"), absl::string_view::npos) << status;
  EXPECT_GE(took, absl::Milliseconds(400));
  EXPECT_LT(took, absl::Seconds(10));
}

TEST_P(DeviceLinkConformanceTest, AbortEndsTheComputeEndsWaitsAtOnce) {
  Open(Shape(2, 4, 1, absl::Seconds(30), GetParam()));
  if (IsSkipped() || HasFatalFailure()) return;
  const auto qkv = LayerBuffers(2, [](int64_t) { return std::vector<float>(4 * 16, 1.f); });
  const auto out = LayerBuffers(2, [](int64_t) { return std::vector<float>(4 * 8, 0.f); });
  ASSERT_TRUE(compute_->SetRows({1, 3}).ok());  // as lines over cuda_ipc, or packets
  QueueStep(1, 1, qkv, 16, out, 8);
  if (HasFatalFailure()) return;
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time aborted = absl::Now();
  ASSERT_TRUE(compute_->Abort().ok());
  ASSERT_TRUE(stream_.Synchronize().ok());
  const absl::Duration took = absl::Now() - aborted;
  const absl::Status status = compute_->TakeStepStatus();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_NE(status.message().find(TransportOf(GetParam()) + ":"), absl::string_view::npos) << status;
  EXPECT_LT(took, absl::Seconds(5)) << "the waits ended " << took << " after Abort; the link's timeout is 30 s";
}

TEST_P(DeviceLinkConformanceTest, AbortEndsTheMemoryEndsWaitsAtOnce) {
  Open(Shape(2, 4, 2, absl::Seconds(30), GetParam()));
  if (IsSkipped() || HasFatalFailure()) return;
  const int chunks = std::min(2, compute_->max_chunks());
  ASSERT_TRUE(Request(link_peer::kAwaitAbort, link_peer::Step{1, 4, chunks}).ok());
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(Request(link_peer::kAbort, std::vector<uint8_t>()).ok());
  auto reply = AwaitReply(absl::Seconds(60));
  ASSERT_TRUE(reply.ok()) << reply.status() << "\npeer's log:\n" << PeerLog();
  EXPECT_TRUE(absl::IsUnavailable(reply->status)) << reply->status;
  EXPECT_NE(reply->status.message().find(TransportOf(GetParam()) + ":"), absl::string_view::npos) << reply->status;
  EXPECT_LT(reply->abort_ms, 5000) << "the link's timeout is 30 s";
}

TEST_P(DeviceLinkConformanceTest, AnOfferThatCannotBeReadIsRefusedNamingTheTransport) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  const LinkShape shape = Shape(1, 4, 1, absl::Seconds(1), GetParam());
  auto compute = CreateComputeLinkEnd(TransportOf(GetParam()), shape, 0);
  if (absl::IsFailedPrecondition(compute.status())) GTEST_SKIP() << compute.status().message();
  ASSERT_TRUE(compute.ok()) << compute.status();
  const std::string offer = (*compute)->Offer();
  for (const std::string& garbled : {std::string(), std::string("garbage"), offer.substr(0, offer.size() / 2)}) {
    auto memory = CreateMemoryLinkEnd(TransportOf(GetParam()), shape, PeerGpu(), garbled);
    ASSERT_FALSE(memory.ok()) << "an offer of " << garbled.size() << " bytes was taken";
    EXPECT_NE(memory.status().message().find(TransportOf(GetParam()) + ":"), absl::string_view::npos) << memory.status();
  }
}

// cuda_ipc sends attention outputs as packets in equal parts a row (LinkShape::out_segments): a
// compute end asked for parts that do not divide a row, or for none, refuses to start, saying so.
TEST(CudaIpcLinkTest, OutputPartsThatDoNotDivideARowAreRefused) {
  const std::string reason = NoGpuReason();
  if (!reason.empty()) GTEST_SKIP() << "needs a GPU: " << reason;
  for (const int64_t parts : {int64_t{3}, int64_t{0}}) {
    LinkShape shape = Shape(1, 4, 1, absl::Seconds(1), "cuda_ipc+packets");
    shape.out_segments = parts;  // of rows of 8 floats
    auto compute = CreateComputeLinkEnd("cuda_ipc", shape, 0);
    ASSERT_FALSE(compute.ok()) << parts << " parts were taken";
    EXPECT_TRUE(absl::IsInvalidArgument(compute.status())) << compute.status();
    EXPECT_NE(compute.status().message().find("attention outputs of 8 floats in " + std::to_string(parts) +
                                              " equal parts"),
              absl::string_view::npos)
        << compute.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, DeviceLinkConformanceTest,
                         ::testing::Values("cuda_ipc", "cuda_ipc+packets", "nccl", "rdma"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "cuda_ipc+packets" ? std::string("cuda_ipc_packets") : info.param;
                         });

}  // namespace
}  // namespace lamina
