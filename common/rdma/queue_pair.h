// RDMA over libibverbs for the rdma data plane: one reliable-connected (RC) queue pair to one peer,
// memory regions in GPU memory (GPUDirect RDMA through dmabuf) and host memory, and RDMA WRITEs
// that land in the peer's memory without its CPU. Writes on one queue pair arrive in the order
// posted, so a flag written after a block of rows is seen only once the rows are there.
//
// Set-up is two steps, with the endpoints exchanged over the pair's control connection in between:
//   auto qp = QueuePair::Open("");           // the first device with an active port
//   send qp->local(), receive the peer's;    // (attention_protocol.h: kOpenLink)
//   qp->Connect(peer);                       // INIT -> RTR -> RTS
// Open fails with FailedPrecondition, naming why, on a machine without an RDMA device or without
// an active port, so that a compute node falls back to the next transport its topology allows.
// `LAMINA_RDMA_GID_INDEX` picks the port's GID (default 0; RoCE v2 often wants 3).
// Thread-compatible.
#ifndef LAMINA_COMMON_RDMA_QUEUE_PAIR_H_
#define LAMINA_COMMON_RDMA_QUEUE_PAIR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/wire.h"

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;
struct ibv_mr;

namespace lamina::rdma {

// What a peer needs to connect to a queue pair.
struct Endpoint {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  uint8_t port = 1;
  std::array<uint8_t, 16> gid{};
  uint8_t gid_index = 0;
  uint32_t mtu = 0;  // enum ibv_mtu of the port

  void Put(WireWriter* w) const;
  absl::Status Get(WireReader* r);
};

// Where a peer may write: an address in its memory and the key of its region.
struct RemoteBuffer {
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint64_t bytes = 0;

  void Put(WireWriter* w) const;
  absl::Status Get(WireReader* r);
};

// A registered region; deregistered when destroyed.
class MemoryRegion {
 public:
  MemoryRegion() = default;
  uint32_t lkey() const;
  // This region as a target for the peer's writes.
  RemoteBuffer remote() const;

 private:
  friend class QueuePair;
  struct Deregister {
    void operator()(ibv_mr* mr) const;
  };
  std::unique_ptr<ibv_mr, Deregister> mr_;
};

class QueuePair {
 public:
  // Opens device `device` (empty: the first with an active port) and makes a queue pair.
  static absl::StatusOr<std::unique_ptr<QueuePair>> Open(const std::string& device);
  ~QueuePair();

  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  const Endpoint& local() const { return local_; }
  // Moves the queue pair to ready-to-send, connected to `peer`.
  absl::Status Connect(const Endpoint& peer);

  // Registers `bytes` of GPU memory at `data` (a cudaMalloc allocation) through a dmabuf, for
  // local reads and the peer's writes. FailedPrecondition where the driver cannot export one.
  absl::StatusOr<MemoryRegion> RegisterGpu(void* data, size_t bytes);
  // Registers host memory, for local reads.
  absl::StatusOr<MemoryRegion> RegisterHost(void* data, size_t bytes);

  // Posts an RDMA WRITE of `bytes` at `local` (inside `region`) to `remote` + `offset`.
  // `signaled` asks for a completion, to be awaited with AwaitCompletion.
  absl::Status Write(const MemoryRegion& region, const void* local, size_t bytes, const RemoteBuffer& remote,
                     uint64_t offset, bool signaled);
  // Waits for the next completion: OK, the failed work request's status, or DeadlineExceeded.
  absl::Status AwaitCompletion(absl::Duration timeout);

 private:
  QueuePair() = default;

  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  Endpoint local_;
};

}  // namespace lamina::rdma

#endif  // LAMINA_COMMON_RDMA_QUEUE_PAIR_H_
