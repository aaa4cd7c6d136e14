// The memory end of a device link in a process of its own, as a memory node is, for the links'
// conformance suite (device_link_conformance_test.cc; device_link_peer.h says what they say).
//
//   device_link_peer ADDRESS    connects to the suite at ADDRESS and serves it until told to quit
//                               or until the connection closes
#include "tests/unit/data_plane/device_link_peer.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/status/status_macros.h"
#include "common/transport/transport.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/packets.h"

namespace lamina::link_peer {
namespace {

namespace kc = kernels::cuda;

// How long the peer waits for the suite's next request before it gives up and exits.
constexpr absl::Duration kIdleLimit = absl::Minutes(5);

// A joined memory end and what its steps need, on the peer's GPU.
class Peer {
 public:
  // kJoin's payload: the link's transport, GPU, shape and the compute end's offer. Returns the
  // answer for the compute end.
  absl::StatusOr<std::string> Join(WireReader& r) {
    std::string transport, offer;
    LAMINA_RETURN_IF_ERROR(r.GetString(&transport));
    LAMINA_RETURN_IF_ERROR(r.Get(&device_));
    LAMINA_RETURN_IF_ERROR(GetShape(r, &shape_));
    LAMINA_RETURN_IF_ERROR(r.GetString(&offer));
    LAMINA_ASSIGN_OR_RETURN(auto joined, CreateMemoryLinkEnd(transport, shape_, device_, offer));
    link_ = std::move(joined.first);
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    LAMINA_ASSIGN_OR_RETURN(stream_, cuda::Stream::Create());
    LAMINA_ASSIGN_OR_RETURN(attention_, cuda::DeviceBuffer::Create(shape_.max_rows * shape_.q_size * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(
        received_, cuda::DeviceBuffer::Create(shape_.num_layers * shape_.max_rows * shape_.qkv_size * sizeof(float)));
    LAMINA_ASSIGN_OR_RETURN(arrivals_, cuda::DeviceBuffer::CreateZeroed(shape_.max_chunks * sizeof(uint32_t)));
    return std::move(joined.second);
  }

  // kServe: the step's memory end, then every layer's rows as they came.
  Reply Serve(const Step& step) {
    Reply reply;
    reply.status = QueueAndFinish(step, nullptr, &reply.abort_ms);
    if (!reply.status.ok()) return reply;
    std::vector<char> rows(step.rows * shape_.qkv_size * sizeof(float));
    for (int64_t layer = 0; layer < shape_.num_layers; ++layer) {
      const cudaError_t copied = cudaMemcpy(rows.data(), ReceivedRows(layer), rows.size(), cudaMemcpyDeviceToHost);
      if (copied != cudaSuccess) {
        reply.status = absl::InternalError(absl::StrCat("copying the received rows: ", cudaGetErrorString(copied)));
        return reply;
      }
      reply.bytes.append(rows.data(), rows.size());
    }
    return reply;
  }

  // kAwaitAbort: the step queued, then Abort once `connection` brings kAbort.
  Reply AwaitAbort(const Step& step, Connection& connection) {
    Reply reply;
    reply.status = QueueAndFinish(step, &connection, &reply.abort_ms);
    return reply;
  }

 private:
  // Queues the step's memory end (and, given `abort_on`, calls Abort once kAbort comes over it,
  // timing how long the waits take to end after it in `*abort_ms`), waits for it and takes the
  // link's step status.
  absl::Status QueueAndFinish(const Step& step, Connection* abort_on, double* abort_ms) {
    if (link_ == nullptr) return absl::FailedPreconditionError("no link joined");
    if (step.rows < 1 || step.rows > shape_.max_rows) {
      return absl::InvalidArgumentError(absl::StrCat(step.rows, " rows for a link of ", shape_.max_rows));
    }
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    absl::Status queued = Queue(step);
    if (abort_on != nullptr) {
      MessageHeader header;
      std::vector<uint8_t> payload;
      LAMINA_RETURN_IF_ERROR(abort_on->Receive(&header, &payload, absl::Now() + kIdleLimit));
      if (header.type != kAbort) return absl::InvalidArgumentError(absl::StrCat("request ", header.type, ", not kAbort"));
      const absl::Time aborted = absl::Now();
      LAMINA_RETURN_IF_ERROR(link_->Abort());
      LAMINA_RETURN_IF_ERROR(stream_.Synchronize());
      *abort_ms = absl::ToDoubleMilliseconds(absl::Now() - aborted);
    }
    // Waits give up after the link's timeout, so this ends.
    LAMINA_RETURN_IF_ERROR(stream_.Synchronize());
    absl::Status step_status = link_->TakeStepStatus();
    return queued.ok() ? step_status : queued;
  }

  // Every layer's memory end on stream_, as a memory node queues it (AttentionExecutor): each
  // chunk of a linked step through DirectHop where the link gives one (the hop's waits and sends
  // standing in for the linked attention launch), else QueueReceive and QueueSend. The
  // "attention" answers each row with its q, and each layer's rows are kept (the next layer's
  // overwrite them).
  absl::Status Queue(const Step& step) {
    const int64_t qkv = shape_.qkv_size, q = shape_.q_size;
    link_->SetStepLayers(0, shape_.num_layers - 1);
    for (int64_t layer = 0; layer < shape_.num_layers; ++layer) {
      for (int c = 0; c < step.chunks; ++c) {
        const RowRange r = ChunkOf(step.rows, step.chunks, c);
        if (r.count == 0) continue;
        const float* in = link_->received() + r.first * qkv;
        float* out = attention_.as<float>() + r.first * q;
        const std::optional<DeviceHop> hop =
            step.linked ? link_->DirectHop(step.step, layer, c, step.chunks, step.rows) : std::nullopt;
        // The link's own sends and waits, as an attention launch linked to the hop would make them.
        const auto* flag_in = hop.has_value() ? std::get_if<DeviceHop::FlagIn>(&hop->in) : nullptr;
        const auto* lines_in = hop.has_value() ? std::get_if<DeviceHop::LinesIn>(&hop->in) : nullptr;
        const auto* packets_in = hop.has_value() ? std::get_if<DeviceHop::PacketsIn>(&hop->in) : nullptr;
        if (lines_in != nullptr) {
          LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(lines_in->lines, qkv, hop->tag, hop->timeout_ns, hop->error,
                                                  hop->error_code, nullptr, r.count, qkv, lines_in->mirror, qkv,
                                                  stream_.get()));
        } else if (packets_in != nullptr) {
          LAMINA_RETURN_IF_ERROR(kc::ReceivePackets({packets_in->packets, kc::PacketsPerRow(qkv), hop->tag, r.count, qkv},
                                                    {hop->timeout_ns, hop->error, hop->error_code},
                                                    {packets_in->mirror, qkv}, stream_.get()));
        } else if (flag_in != nullptr) {
          LAMINA_RETURN_IF_ERROR(kc::WaitFlag(flag_in->ready, flag_in->ready_value, hop->timeout_ns, hop->error,
                                              hop->error_code, stream_.get()));
        } else {
          LAMINA_RETURN_IF_ERROR(link_->QueueReceive(step.step, layer, c, step.chunks, step.rows, stream_.get()));
        }
        LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ReceivedRows(layer) + r.first * qkv, in,
                                                    r.count * qkv * sizeof(float), cudaMemcpyDeviceToDevice,
                                                    stream_.get()));
        LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(out, q * sizeof(float), in, qkv * sizeof(float),
                                                      q * sizeof(float), r.count, cudaMemcpyDeviceToDevice,
                                                      stream_.get()));
        const auto* rows_out = hop.has_value() ? std::get_if<DeviceHop::RowsOut>(&hop->out) : nullptr;
        const auto* lines_out = hop.has_value() ? std::get_if<DeviceHop::LinesOut>(&hop->out) : nullptr;
        const auto* packets_out = hop.has_value() ? std::get_if<DeviceHop::PacketsOut>(&hop->out) : nullptr;
        if (lines_out != nullptr) {
          LAMINA_RETURN_IF_ERROR(kc::SendLines(out, q, nullptr, r.count, q, lines_out->lines, lines_out->stride,
                                               hop->tag, hop->error, stream_.get()));
        } else if (packets_out != nullptr) {
          LAMINA_RETURN_IF_ERROR(kc::SendPackets(out, q, nullptr, r.count, q, packets_out->packets,
                                                 kc::PacketsPerRow(q, packets_out->segments), hop->tag, hop->error,
                                                 stream_.get(), nullptr, packets_out->segments));
        } else if (rows_out != nullptr) {
          LAMINA_RETURN_IF_ERROR(kc::SendRows(out, q, nullptr, r.count, q, rows_out->out, rows_out->stride,
                                              rows_out->done, rows_out->done_value, hop->error,
                                              arrivals_.as<uint32_t>() + c, stream_.get()));
        } else {
          LAMINA_RETURN_IF_ERROR(
              link_->QueueSend(step.step, layer, c, step.chunks, step.rows, attention_.as<float>(), q, stream_.get()));
        }
      }
    }
    return absl::OkStatus();
  }

  float* ReceivedRows(int64_t layer) const {
    return received_.as<float>() + layer * shape_.max_rows * shape_.qkv_size;
  }

  LinkShape shape_;
  int32_t device_ = 0;
  cuda::Stream stream_;
  cuda::DeviceBuffer attention_;  // float [max_rows, q_size]: the "attention" outputs
  cuda::DeviceBuffer received_;   // float [num_layers, max_rows, qkv_size]: each layer's rows as they came
  cuda::DeviceBuffer arrivals_;   // uint32 [max_chunks], zeroed: SendRows' block counts
  // Last, so destroyed first: a link's queued work ends before the buffers it uses are freed.
  std::unique_ptr<MemoryLinkEnd> link_;
};

absl::Status SendReply(Connection& connection, const Reply& reply) {
  std::vector<uint8_t> bytes;
  WireWriter w(&bytes);
  PutReply(w, reply);
  const ByteSpan parts[] = {ByteSpan(bytes)};
  return connection.Send({kReply, 0, 0}, parts);
}

int Serve(const std::string& address) {
  std::unique_ptr<Transport> tcp = MakeTcpTransport();
  auto connection = tcp->Connect(address, absl::Now() + absl::Seconds(30));
  if (!connection.ok()) {
    std::fprintf(stderr, "device_link_peer: %s\n", std::string(connection.status().message()).c_str());
    return 1;
  }
  Peer peer;
  MessageHeader header;
  std::vector<uint8_t> payload;
  while (true) {
    const absl::Status received = (*connection)->Receive(&header, &payload, absl::Now() + kIdleLimit);
    if (absl::IsUnavailable(received)) return 0;  // the suite closed the connection
    if (!received.ok()) {
      std::fprintf(stderr, "device_link_peer: %s\n", std::string(received.message()).c_str());
      return 1;
    }
    WireReader r(payload.data(), payload.size());
    Reply reply;
    Step step;
    switch (header.type) {
      case kJoin: {
        absl::StatusOr<std::string> answer = peer.Join(r);
        reply.status = answer.status();
        if (answer.ok()) reply.bytes = std::move(*answer);
        break;
      }
      case kServe:
        reply.status = GetStep(r, &step);
        if (reply.status.ok()) reply = peer.Serve(step);
        break;
      case kAwaitAbort:
        reply.status = GetStep(r, &step);
        if (reply.status.ok()) reply = peer.AwaitAbort(step, **connection);
        break;
      case kQuit:
        return 0;
      default:
        reply.status = absl::InvalidArgumentError(absl::StrCat("unknown request ", header.type));
    }
    if (!reply.status.ok()) std::fprintf(stderr, "device_link_peer: %s\n", reply.status.ToString().c_str());
    const absl::Status sent = SendReply(**connection, reply);
    if (!sent.ok()) {
      std::fprintf(stderr, "device_link_peer: replying: %s\n", std::string(sent.message()).c_str());
      return 1;
    }
  }
}

}  // namespace
}  // namespace lamina::link_peer

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: device_link_peer ADDRESS\n");
    return 2;
  }
  return lamina::link_peer::Serve(argv[1]);
}
