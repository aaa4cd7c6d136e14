// Serves an AttentionService (the memory node's executor) to compute nodes over a transport:
// one thread accepts connections, one thread per connection answers its requests in order.
// A malformed request gets an error reply and the connection stays up; a broken connection ends
// only its own thread. Thread-safe; the service is called under `service_mu`, which the node's
// other users of the service (the gRPC FreeSequences handler) share.
//
// With an `executor` whose pool is on a GPU, a compute node may open a device-side data plane
// (device_link.h) on its connection: its decode steps then go GPU to GPU, and the connection
// carries only each step's plan and outcome. When the connection closes mid-step, the link is
// aborted (MemoryLinkEnd::Abort), so that the step's waits end then rather than at their timeout.
// Device steps are bracketed for the process's QuiescentRelease, and a closed connection's link
// and lane are retired there: freeing their memory while other steps' waits spin would stall them.
// A connection may carry a tensor-parallel rank's share of the heads (kSelectHeads): its calls go
// to the executor's windowed StoreKvHeads and DecodeHeads, on the host path.
#ifndef LAMINA_MEMORY_NODE_DATA_PLANE_ATTENTION_SERVER_H_
#define LAMINA_MEMORY_NODE_DATA_PLANE_ATTENTION_SERVER_H_

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/attention/attention_service.h"
#include "common/metrics/busy_meter.h"
#include "common/transport/peer_watch.h"
#include "common/transport/transport.h"
#include "common/transport/wire.h"
#include "data_plane/attention_protocol.h"
#include "data_plane/device_link.h"
#include "kv/attention/attention_executor.h"

namespace lamina {

class AttentionServer {
 public:
  static absl::StatusOr<std::unique_ptr<AttentionServer>> Start(Transport* transport, const std::string& address,
                                                               const AttentionWireShape& shape,
                                                               AttentionService* service, std::mutex* service_mu,
                                                               AttentionExecutor* executor = nullptr);
  ~AttentionServer();  // stops accepting, closes every connection, joins the threads

  std::string address() const { return listener_->address(); }
  // Time spent handling requests (storing k/v, attention), from every connection.
  const BusyMeter& busy() const { return busy_; }
  // Host-path decode requests alone: their time, and the rows they attended (busy_count of the
  // snapshot counts requests; attended_rows() rows).
  const BusyMeter& decode_busy() const { return decode_busy_; }
  int64_t attended_rows() const { return attended_rows_.load(std::memory_order_relaxed); }

 private:
  AttentionServer(std::unique_ptr<Listener> listener, const AttentionWireShape& shape, AttentionService* service,
                  std::mutex* service_mu, AttentionExecutor* executor)
      : listener_(std::move(listener)), shape_(shape), service_(service), service_mu_(service_mu),
        executor_(executor) {}
  void AcceptLoop();
  void Serve(Connection* connection);
  // A connection's buffers, kept for its lifetime so that steady-state requests allocate nothing,
  // and its device link.
  struct Scratch {
    std::vector<uint8_t> request, reply;
    std::string answer;  // kOpenLink's reply
    std::unique_ptr<MemoryLinkEnd> link;
    std::unique_ptr<DeviceKvLane> lane;  // the link's stream and step buffers on the pool's GPU
    int64_t link_rows = 0;
    int link_chunks = 0;
    // A step prepared by kBeginDecode, queued once the reply is out; how the queueing went.
    // A store (kBeginStore) when `transfers` (each one's rows) is not empty.
    struct {
      bool pending = false;
      uint64_t step = 0;
      int64_t rows = 0;
      int chunks = 1;
      std::vector<int64_t> transfers;
      std::vector<int64_t> layers;  // the step's layers; empty: all
      bool linked = true;           // AttentionExecutor::MayLink of a decode step's rows
    } begun;
    absl::Status queued;
    // Armed while a step is queued: the lane paces its queueing to the GPU (kv_backend.h), which
    // waits for the compute node, so a compute node that dies then must end the waits from here.
    PeerWatch queueing_watch;
    bool step_open = false;  // a step is queued on the link and not yet ended (kEndDecode)
    // The kv heads this connection's calls carry (kSelectHeads; every head until then), and the
    // floats of q and of k (or v) a row holds.
    bool windowed = false;
    KvHeadWindow heads;
    int64_t q_size = 0;
    int64_t kv_size = 0;
    std::vector<float> out;  // kDecode's outputs
    std::vector<Reservation> reservations;
    std::vector<DecodeEntry> entries;
    std::vector<SequenceId> seqs;
  };
  // Handles one request (in scratch->request) and returns the call's status.
  absl::Status Handle(uint32_t type, Scratch* scratch);
  // Waits for the connection's device step (aborted or not) to end, then ends it for the
  // process's QuiescentRelease; its outcome.
  absl::Status EndStep(Scratch* scratch);
  // Ends the connection's open step, if any, at once: its waits aborted (MemoryLinkEnd::Abort),
  // then EndStep. The abort's outcome (when it failed, the waits ended at their timeout).
  absl::Status AbortStep(Scratch* scratch);
  // Hands the connection's link and lane to the process's QuiescentRelease: their device memory
  // is freed once no device step runs.
  void RetireLink(Scratch* scratch);
  absl::Status HandleLink(uint32_t type, WireReader* r, Scratch* scratch);
  absl::Status SelectHeads(WireReader* r, Scratch* scratch);

  std::unique_ptr<Listener> listener_;
  AttentionWireShape shape_;
  AttentionService* service_;
  std::mutex* service_mu_;
  AttentionExecutor* executor_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  // A compute node's connection and the thread serving it; `done` once the thread has returned,
  // when the next accept joins it and closes the connection (so that connections that come and go
  // hold no thread or descriptor).
  struct Served {
    std::unique_ptr<Connection> connection;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  // At most this many connections at once; one more is closed as soon as it is accepted.
  static constexpr size_t kMostConnections = 256;
  std::mutex connections_mu_;
  std::list<Served> connections_ ABSL_GUARDED_BY(connections_mu_);
  BusyMeter busy_;
  BusyMeter decode_busy_;
  std::atomic<int64_t> attended_rows_{0};
};

}  // namespace lamina

#endif  // LAMINA_MEMORY_NODE_DATA_PLANE_ATTENTION_SERVER_H_
