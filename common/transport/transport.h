// The data plane between compute and memory nodes: message connections, one interface and several
// implementations chosen per pair of peers (tcp and inproc today; cuda_ipc, nccl and rdma later).
//
// A Connection carries whole messages, each a small header and a payload, in order, both ways.
// Send never blocks forever (it fails with Unavailable when the peer is gone); Receive waits at
// most until its deadline (DeadlineExceeded; a deadline already past still takes a message that
// has arrived) and returns Unavailable when the peer closed.
// Buffers are the caller's and are reused across calls, so steady-state traffic allocates nothing.
// Thread-safety: one thread may Send while another Receives on the same connection; two
// concurrent Sends (or Receives) must be serialised by the caller.
#ifndef LAMINA_COMMON_TRANSPORT_TRANSPORT_H_
#define LAMINA_COMMON_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/security/cluster_secret.h"

namespace lamina {

struct MessageHeader {
  uint32_t type = 0;  // meaning is the protocol's (data_plane/attention_protocol.h)
  uint32_t flags = 0;
  uint64_t tag = 0;   // echoed in replies to match them to requests
};

using ByteSpan = absl::Span<const uint8_t>;

class Connection {
 public:
  virtual ~Connection() = default;
  // Sends one message whose payload is the concatenation of `parts`.
  virtual absl::Status Send(const MessageHeader& header, absl::Span<const ByteSpan> parts) = 0;
  // Receives the next message; `payload` is resized to fit (its capacity is kept).
  virtual absl::Status Receive(MessageHeader* header, std::vector<uint8_t>* payload, absl::Time deadline) = 0;
  // Closes both directions; the peer's pending and later calls fail with Unavailable.
  virtual void Close() = 0;
  // Without waiting or taking a message: whether the peer has closed its end (or died), or Close
  // was called here. Messages the peer sent before it closed may still be waiting to be received.
  // Safe beside a Send or Receive on another thread.
  virtual bool PeerClosed() = 0;
  // The peer's address, for error messages.
  virtual std::string peer() const = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Waits for the next connection until `deadline` (DeadlineExceeded) or Close() (Cancelled).
  virtual absl::StatusOr<std::unique_ptr<Connection>> Accept(absl::Time deadline) = 0;
  // The address peers connect to (with the real port when 0 was asked for).
  virtual std::string address() const = 0;
  virtual void Close() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // `address` is "host:port" for tcp (port 0 picks one), any unique name for inproc.
  virtual absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) = 0;
  // Unavailable when nobody listens there; DeadlineExceeded when the peer does not answer in time.
  virtual absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Time deadline) = 0;
};

struct TcpTransportOptions {
  // Connect to a listener of this host over the unix socket it keeps beside its port, skipping
  // the TCP/IP stack (every listener keeps one; see tcp_transport.cc); false: TCP always.
  bool same_host_unix_sockets = true;
};

// Sockets with length-prefixed frames: CPU nodes, CI, and the fallback everywhere. With a cluster
// secret, every connection proves it (common/security/cluster_secret.h): Connect answers the
// accepting end's challenge, and an accepted connection challenges its peer on its first Send or
// Receive, closing it (Unauthenticated) when the answer is wrong.
std::unique_ptr<Transport> MakeTcpTransport(std::optional<ClusterSecret> secret = std::nullopt,
                                            const TcpTransportOptions& options = {});
// In-process queues: single-process mode and tests. Listeners are visible to every
// inproc transport in the process.
std::unique_ptr<Transport> MakeInprocTransport();
// By name ("tcp", "inproc"); InvalidArgument names an unknown or unavailable one.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name);

}  // namespace lamina

#endif  // LAMINA_COMMON_TRANSPORT_TRANSPORT_H_
