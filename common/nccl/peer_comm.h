// A two-rank NCCL communicator joining this process's GPU and one peer process's GPU: the nccl
// data plane's point-to-point sends and receives, queued on CUDA streams. NCCL carries them over
// NVLink inside a host and over InfiniBand/RoCE (GPUDirect RDMA where the NICs allow) or sockets
// across hosts.
//
// Nothing here waits forever. Joining does not block: Start returns at once, and a background
// thread finishes the join and then exchanges one float each way, so that NCCL's connections (made
// lazily on first use) are up before the first real step. The same thread is the watchdog: work
// between BeginWatch and EndWatch must finish within the timeout of the GPU reaching it, or the
// communicator is aborted (its queued kernels end at once, leaving garbage behind) and every later
// call fails. A dead peer thus turns into DeadlineExceeded on this side, as a cuda_ipc wait that
// gives up does; time a stream spends waiting on other work before BeginWatch does not count.
//
// A rank's sends and receives are matched with the peer's in the order each side queues them, and a
// send may not finish before the peer queues the matching receive: both sides must queue the same
// exchanges in the same order.
//
// Thread-safe.
#ifndef LAMINA_COMMON_NCCL_PEER_COMM_H_
#define LAMINA_COMMON_NCCL_PEER_COMM_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lamina::nccl {

// A new communicator's id, as bytes for rank 0 to hand to rank 1.
absl::StatusOr<std::string> NewCommId();

class PeerComm {
 public:
  // Starts joining communicator `id` (NewCommId) as `rank` (0 or 1) on GPU `device`. The join and
  // the first exchange may take `join_timeout` (NCCL probes the machine's topology as it joins);
  // each watched piece of work `timeout`.
  static absl::StatusOr<std::unique_ptr<PeerComm>> Start(const std::string& id, int rank, int device,
                                                         absl::Duration join_timeout, absl::Duration timeout);
  // Aborts the communicator: never waits for the peer.
  ~PeerComm();

  PeerComm(const PeerComm&) = delete;
  PeerComm& operator=(const PeerComm&) = delete;

  // Waits until the join and the first exchange are done: OK, or what ended them.
  absl::Status AwaitReady();

  // Queue on `stream` (of this comm's GPU): `count` floats to, or from, the peer. After AwaitReady.
  absl::Status Send(const float* data, int64_t count, cudaStream_t stream);
  absl::Status Recv(float* data, int64_t count, cudaStream_t stream);

  // The work queued on `stream` between the two calls must finish within the timeout, counted from
  // when the stream reaches it. Pairs on one stream, in order; a BeginWatch after a BeginWatch
  // closes the open piece there.
  absl::Status BeginWatch(cudaStream_t stream);
  absl::Status EndWatch(cudaStream_t stream);

  // OK while the communicator works; once it has failed (timed out, aborted, an NCCL error), why.
  absl::Status health() const;
  // Any thread: the peer is gone, so the communicator is aborted now rather than when the watchdog
  // times its work out; health() reports `why` from then on (unless it had failed already).
  void Abort(absl::Status why);

 private:
  PeerComm(int rank, int device, absl::Duration join_timeout, absl::Duration timeout)
      : rank_(rank), device_(device), join_timeout_(join_timeout), timeout_(timeout) {}

  void Run();  // the background thread: join, first exchange, then watchdog
  // NCCL's state, waiting out ncclInProgress (a non-blocking communicator's calls may return it).
  ncclResult_t Settle(ncclResult_t result);
  absl::Status FirstExchange();
  // Records `status` as the communicator's failure and aborts it. Holds mu_.
  void FailLocked(absl::Status status);
  absl::Status NcclError(const char* what, ncclResult_t result);
  // Sleeps `d` unless stopping; false when stopping.
  bool Nap(std::unique_lock<std::mutex>& lock, absl::Duration d);
  // The watchdog's check of the oldest watched work: OK, or why it failed.
  absl::Status CheckWatchedLocked();
  absl::StatusOr<cudaEvent_t> RecordLocked(cudaStream_t stream);

  struct Watched {
    cudaEvent_t begin = nullptr;
    cudaEvent_t end = nullptr;  // null until EndWatch
    absl::Time reached = absl::InfiniteFuture();  // when the watchdog first saw `begin` done
  };

  const int rank_;
  const int device_;
  const absl::Duration join_timeout_;
  const absl::Duration timeout_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  ncclComm_t comm_ = nullptr;      // null once aborted
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the failure, once failed
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  cudaStream_t own_stream_ = nullptr;  // the first exchange's
  float* scratch_ = nullptr;           // the first exchange's two floats (device memory)
  std::deque<Watched> watched_;       // oldest first
  std::vector<cudaEvent_t> spare_events_;
  std::thread thread_;
};

}  // namespace lamina::nccl

#endif  // LAMINA_COMMON_NCCL_PEER_COMM_H_
