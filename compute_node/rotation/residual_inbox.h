// A compute node's door for batches handed over by the previous replica under rotational
// pipelining. It listens on the node's data port; each connection starts with a hello naming the
// batch it carries (one connection per batch and sending replica), and is then kept for that
// batch's hand-overs. A replica that reconnects (after a broken connection) replaces its old one.
// Thread-safe.
#ifndef LAMINA_COMPUTE_NODE_ROTATION_RESIDUAL_INBOX_H_
#define LAMINA_COMPUTE_NODE_ROTATION_RESIDUAL_INBOX_H_

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/transport.h"

namespace lamina {

// The hand-over protocol, one message per slice input.
namespace handoff {
inline constexpr uint32_t kHello = 1;      // tag: the batch; payload: the sender's name
inline constexpr uint32_t kResidual = 2;   // flags: the slice; tag: the pass; payload: floats
inline constexpr uint32_t kAttnOut = 3;    // likewise
}  // namespace handoff

class ResidualInbox {
 public:
  // Listens at `address` ("host:port" for tcp) until destroyed.
  static absl::StatusOr<std::unique_ptr<ResidualInbox>> Start(Transport* transport, const std::string& address);
  ~ResidualInbox();

  // The connection carrying batch `batch`, waiting for it until `deadline` (DeadlineExceeded).
  absl::StatusOr<std::shared_ptr<Connection>> Await(int batch, absl::Time deadline);
  // Forgets `connection` if it still carries `batch` (it broke).
  void Drop(int batch, const std::shared_ptr<Connection>& connection);
  // The sender's name on the connection carrying `batch` ("" before one arrives).
  std::string SenderOf(int batch) const;
  std::string address() const { return listener_->address(); }

 private:
  explicit ResidualInbox(std::unique_ptr<Listener> listener) : listener_(std::move(listener)) {}
  void AcceptLoop();

  std::unique_ptr<Listener> listener_;
  mutable std::mutex mu_;
  std::condition_variable arrived_;
  struct Inbound {
    std::shared_ptr<Connection> connection;
    std::string sender;
  };
  std::map<int, Inbound> by_batch_;  // guarded by mu_
  bool stopping_ = false;            // guarded by mu_
  std::thread acceptor_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ROTATION_RESIDUAL_INBOX_H_
