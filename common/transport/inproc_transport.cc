// In-process transport: a connection is a pair of message queues shared by its two ends.
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/transport/transport.h"

namespace lamina {
namespace {

struct Message {
  MessageHeader header;
  std::vector<uint8_t> payload;
};

// One direction of a connection.
class Queue {
 public:
  absl::Status Push(Message message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::UnavailableError("inproc peer closed the connection");
    messages_.push_back(std::move(message));
    ready_.notify_one();
    return absl::OkStatus();
  }
  absl::Status Pop(Message* message, absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return closed_ || !messages_.empty(); };
    if (deadline == absl::InfiniteFuture()) {
      ready_.wait(lock, ready);
    } else if (!ready_.wait_until(lock, absl::ToChronoTime(deadline), ready)) {
      return absl::DeadlineExceededError("no inproc message before the deadline");
    }
    if (messages_.empty()) return absl::UnavailableError("inproc peer closed the connection");
    *message = std::move(messages_.front());
    messages_.pop_front();
    return absl::OkStatus();
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    ready_.notify_all();
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Message> messages_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class InprocConnection : public Connection {
 public:
  InprocConnection(std::shared_ptr<Queue> in, std::shared_ptr<Queue> out, std::string peer)
      : in_(std::move(in)), out_(std::move(out)), peer_(std::move(peer)) {}
  ~InprocConnection() override { Close(); }

  absl::Status Send(const MessageHeader& header, absl::Span<const ByteSpan> parts) override {
    Message message{header, {}};
    for (const ByteSpan& part : parts) message.payload.insert(message.payload.end(), part.begin(), part.end());
    return out_->Push(std::move(message));
  }
  absl::Status Receive(MessageHeader* header, std::vector<uint8_t>* payload, absl::Time deadline) override {
    Message message;
    absl::Status status = in_->Pop(&message, deadline);
    if (!status.ok()) return status;
    *header = message.header;
    payload->assign(message.payload.begin(), message.payload.end());
    return absl::OkStatus();
  }
  void Close() override {
    in_->Close();
    out_->Close();
  }
  // Either end's Close closes both queues.
  bool PeerClosed() override { return in_->closed(); }
  std::string peer() const override { return peer_; }

 private:
  std::shared_ptr<Queue> in_, out_;
  std::string peer_;
};

class InprocListener;

// Listeners by address, shared by every inproc transport of the process.
struct Registry {
  std::mutex mu;
  std::map<std::string, InprocListener*> listeners ABSL_GUARDED_BY(mu);
  static Registry& Get() {
    static Registry* registry = new Registry;
    return *registry;
  }
};

class InprocListener : public Listener {
 public:
  explicit InprocListener(std::string address) : address_(std::move(address)) {}
  ~InprocListener() override { Close(); }

  // Called by Connect: queues the server end of a new connection.
  void Offer(std::unique_ptr<Connection> connection) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(connection));
    ready_.notify_one();
  }

  absl::StatusOr<std::unique_ptr<Connection>> Accept(absl::Time deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return closed_ || !pending_.empty(); };
    if (deadline == absl::InfiniteFuture()) {
      ready_.wait(lock, ready);
    } else if (!ready_.wait_until(lock, absl::ToChronoTime(deadline), ready)) {
      return absl::DeadlineExceededError("no connection before the deadline");
    }
    if (closed_) return absl::CancelledError("listener closed");
    std::unique_ptr<Connection> connection = std::move(pending_.front());
    pending_.pop_front();
    return connection;
  }

  std::string address() const override { return address_; }

  void Close() override {
    {
      std::lock_guard<std::mutex> lock(Registry::Get().mu);
      auto it = Registry::Get().listeners.find(address_);
      if (it != Registry::Get().listeners.end() && it->second == this) Registry::Get().listeners.erase(it);
    }
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    ready_.notify_all();
  }

 private:
  std::string address_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<Connection>> pending_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class InprocTransport : public Transport {
 public:
  std::string name() const override { return "inproc"; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    Registry& registry = Registry::Get();
    std::lock_guard<std::mutex> lock(registry.mu);
    if (registry.listeners.count(address)) {
      return absl::AlreadyExistsError(absl::StrCat("inproc address ", address, " is already in use"));
    }
    auto listener = std::make_unique<InprocListener>(address);
    registry.listeners[address] = listener.get();
    return std::unique_ptr<Listener>(std::move(listener));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Time) override {
    Registry& registry = Registry::Get();
    std::lock_guard<std::mutex> lock(registry.mu);
    auto it = registry.listeners.find(address);
    if (it == registry.listeners.end()) {
      return absl::UnavailableError(absl::StrCat("nobody listens on inproc address ", address));
    }
    auto to_server = std::make_shared<Queue>(), to_client = std::make_shared<Queue>();
    it->second->Offer(std::make_unique<InprocConnection>(to_server, to_client, "inproc client"));
    return std::unique_ptr<Connection>(new InprocConnection(to_client, to_server, address));
  }
};

}  // namespace

std::unique_ptr<Transport> MakeInprocTransport() { return std::make_unique<InprocTransport>(); }

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name) {
  if (name == "tcp") return MakeTcpTransport();
  if (name == "inproc") return MakeInprocTransport();
  return absl::InvalidArgumentError(absl::StrCat("transport '", name, "' is not available (available: tcp, inproc)"));
}

}  // namespace lamina
