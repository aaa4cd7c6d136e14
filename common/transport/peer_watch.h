// Watches the connections of the peers a step on the GPU waits for. Such a step's waits spin on the
// GPU for what the peer writes into this GPU's memory, and give up only after their timeout
// (seconds) when the peer dies mid-step; its connection closes at once, though. The watch sees
// that and calls the peer's abort, which makes those waits end (ComputeLinkEnd::Abort for a memory
// node's link, DeviceInbox::Abort for a compute node's hand-overs), so that the step fails within
// about `period` and names the peer.
//
// One background thread, started by the first Arm: while armed it asks each watched connection
// whether its peer has closed (Connection::PeerClosed, which takes no message) every `period`, and
// calls each such abort once; disarmed it sleeps. Thread-safe.
#ifndef LAMINA_COMMON_TRANSPORT_PEER_WATCH_H_
#define LAMINA_COMMON_TRANSPORT_PEER_WATCH_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/transport/transport.h"

namespace lamina {

class PeerWatch {
 public:
  struct Watched {
    std::string what;        // the peer, for the log line: "memory node 'memory-1' (cuda_ipc)"
    Connection* connection;  // the peer's
    std::function<absl::Status()> abort;
  };

  explicit PeerWatch(absl::Duration period = absl::Milliseconds(2)) : period_(period) {}
  ~PeerWatch();  // joins the thread
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Watches `watched` until Disarm; the connections, and what the aborts touch, must outlive the
  // watch.
  void Arm(std::vector<Watched> watched);
  // Stops watching. Once it returns, the thread touches none of what Arm gave it. Idempotent.
  void Disarm();
  // How many aborts the watch has called.
  int aborted() const;

 private:
  void Run();

  const absl::Duration period_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Watched> watched_ ABSL_GUARDED_BY(mu_);  // not yet aborted
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int aborted_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TRANSPORT_PEER_WATCH_H_
