// Watches the control connections of a device step's memory nodes while the step runs on the GPU.
// The step's waits spin on the GPU for their rows, and would give up only after the link's timeout
// (seconds) when a memory node dies mid-step; its control connection closes at once, though. The
// watch sees that and aborts the node's link (ComputeLinkEnd::Abort), so that the step's waits on it
// end within about `period`, and the step fails that node's sequences only.
//
// One background thread, started by the first Arm: while armed it asks each watched connection
// whether its peer has closed (Connection::PeerClosed, which takes no message) every `period`, and
// aborts each such link once; disarmed it sleeps. Thread-safe.
#ifndef LAMINA_COMPUTE_NODE_REMOTE_LINK_WATCH_H_
#define LAMINA_COMPUTE_NODE_REMOTE_LINK_WATCH_H_

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/transport/transport.h"
#include "memory_node/data_plane/device_link.h"

namespace lamina {

class LinkWatch {
 public:
  struct Watched {
    std::string name;  // the memory node's, for the log line
    Connection* connection;
    ComputeLinkEnd* link;
  };

  explicit LinkWatch(absl::Duration period = absl::Milliseconds(2)) : period_(period) {}
  ~LinkWatch();  // joins the thread
  LinkWatch(const LinkWatch&) = delete;
  LinkWatch& operator=(const LinkWatch&) = delete;

  // Watches `watched` until Disarm; the connections and links must outlive the watch.
  void Arm(std::vector<Watched> watched);
  // Stops watching. Once it returns, the thread touches none of what Arm gave it. Idempotent.
  void Disarm();
  // How many links the watch has aborted.
  int aborted() const;

 private:
  void Run();

  const absl::Duration period_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Watched> watched_;  // not yet aborted
  bool armed_ = false;
  bool stopping_ = false;
  int aborted_ = 0;
  std::thread thread_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_REMOTE_LINK_WATCH_H_
