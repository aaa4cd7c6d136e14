// A compute node's door for batches handed over by the previous replica under rotational
// pipelining. It listens on the node's data port; each connection starts with a hello naming the
// batch it carries (one connection per batch and sending replica), and is then kept for that
// batch's hand-overs. A replica that reconnects (after a broken connection) replaces its old one.
//
// On a GPU node the inbox also holds a DeviceInbox per batch (device_handoff.h) and offers it in
// its reply to the hello; the sender answers whether it could open it. If it did, that batch's
// hand-overs go GPU to GPU from then on, and the connection only shows that the sender is alive.
// Thread-safe.
#ifndef LAMINA_COMPUTE_NODE_ROTATION_RESIDUAL_INBOX_H_
#define LAMINA_COMPUTE_NODE_ROTATION_RESIDUAL_INBOX_H_

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/transport.h"
#include "compute_node/rotation/device_handoff.h"

namespace lamina {

// The hand-over protocol, one message per slice input.
namespace handoff {
inline constexpr uint32_t kHello = 1;      // tag: the batch; payload: the sender's name
inline constexpr uint32_t kResidual = 2;   // flags: the slice; tag: the pass; payload: floats
inline constexpr uint32_t kAttnOut = 3;    // likewise
inline constexpr uint32_t kHelloReply = 4; // payload: the batch's DeviceInbox offer; empty: none
inline constexpr uint32_t kDeviceAck = 5;  // flags: 1 when the sender opened the offer
}  // namespace handoff

// The GPU hand-overs a node offers: none when `device` < 0.
struct DeviceHandoffs {
  int device = -1;
  HandoffShape shape;
  int batches = 0;  // one inbox for each
};

class ResidualInbox {
 public:
  // Listens at `address` ("host:port" for tcp) until destroyed. With `device`, first makes the
  // batches' DeviceInboxes; a GPU that cannot gets a message on stderr, and host hand-overs.
  static absl::StatusOr<std::unique_ptr<ResidualInbox>> Start(Transport* transport, const std::string& address,
                                                              const DeviceHandoffs& device = {});
  ~ResidualInbox();

  // The connection carrying batch `batch`, waiting for it until `deadline` (DeadlineExceeded).
  absl::StatusOr<std::shared_ptr<Connection>> Await(int batch, absl::Time deadline);
  // Whether this node offers GPU hand-overs at all (a GPU that could make its inboxes), and the
  // most rows one carries.
  bool offers_device() const { return !device_inboxes_.empty(); }
  int64_t device_max_rows() const { return device_max_rows_; }
  // Whether the sender of `batch` hands it over GPU to GPU: its DeviceInbox then, else null.
  // Waits for the sender's connection as Await does.
  absl::StatusOr<DeviceInbox*> AwaitDevice(int batch, absl::Time deadline);
  // Forgets `connection` if it still carries `batch` (it broke).
  void Drop(int batch, const std::shared_ptr<Connection>& connection);
  // The sender's name on the connection carrying `batch` ("" before one arrives).
  std::string SenderOf(int batch) const;
  std::string address() const { return listener_->address(); }

 private:
  explicit ResidualInbox(std::unique_ptr<Listener> listener) : listener_(std::move(listener)) {}
  void AcceptLoop();
  // The hello's reply and the sender's answer: whether `batch` goes GPU to GPU.
  bool AgreeOnDevice(int batch, Connection* connection);

  std::unique_ptr<Listener> listener_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  struct Inbound {
    std::shared_ptr<Connection> connection;
    std::string sender;
    DeviceInbox* device = nullptr;  // when the sender hands over GPU to GPU
  };
  std::map<int, Inbound> by_batch_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::unique_ptr<DeviceInbox>> device_inboxes_;  // made at Start, then only read
  int64_t device_max_rows_ = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread acceptor_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ROTATION_RESIDUAL_INBOX_H_
