#include "common/rdma/queue_pair.h"

#include <cuda.h>  // types of the driver call fetched below; libcuda is not linked
#include <cuda_runtime_api.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace lamina::rdma {
namespace {

std::string Errno(int error) { return std::strerror(error); }

int GidIndex() {
  const char* text = std::getenv("LAMINA_RDMA_GID_INDEX");
  return text == nullptr ? 0 : std::atoi(text);
}

// Finds the port of `context` that is active, if any.
int ActivePort(ibv_context* context, ibv_port_attr* attributes) {
  ibv_device_attr device;
  if (ibv_query_device(context, &device) != 0) return 0;
  for (int port = 1; port <= device.phys_port_cnt; ++port) {
    if (ibv_query_port(context, port, attributes) == 0 && attributes->state == IBV_PORT_ACTIVE) return port;
  }
  return 0;
}

using GetHandleFn = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);

}  // namespace

void Endpoint::Put(WireWriter* w) const {
  w->Put<uint32_t>(qpn);
  w->Put<uint32_t>(psn);
  w->Put<uint16_t>(lid);
  w->Put<uint8_t>(port);
  w->PutBytes(gid.data(), gid.size());
  w->Put<uint8_t>(gid_index);
  w->Put<uint32_t>(mtu);
}

absl::Status Endpoint::Get(WireReader* r) {
  const uint8_t* bytes = nullptr;
  absl::Status s = r->Get(&qpn);
  if (s.ok()) s = r->Get(&psn);
  if (s.ok()) s = r->Get(&lid);
  if (s.ok()) s = r->Get(&port);
  if (s.ok()) s = r->GetBytes(gid.size(), &bytes);
  if (s.ok()) std::memcpy(gid.data(), bytes, gid.size());
  if (s.ok()) s = r->Get(&gid_index);
  if (s.ok()) s = r->Get(&mtu);
  return s;
}

void RemoteBuffer::Put(WireWriter* w) const {
  w->Put<uint64_t>(address);
  w->Put<uint32_t>(rkey);
  w->Put<uint64_t>(bytes);
}

absl::Status RemoteBuffer::Get(WireReader* r) {
  absl::Status s = r->Get(&address);
  if (s.ok()) s = r->Get(&rkey);
  if (s.ok()) s = r->Get(&bytes);
  return s;
}

void MemoryRegion::Deregister::operator()(ibv_mr* mr) const { ibv_dereg_mr(mr); }

uint32_t MemoryRegion::lkey() const { return mr_->lkey; }

RemoteBuffer MemoryRegion::remote() const {
  return {reinterpret_cast<uint64_t>(mr_->addr), mr_->rkey, mr_->length};
}

absl::StatusOr<std::unique_ptr<QueuePair>> QueuePair::Open(const std::string& device) {
  int count = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices == nullptr || count == 0) {
    if (devices != nullptr) ibv_free_device_list(devices);
    return absl::FailedPreconditionError("rdma: no RDMA device on this machine (libibverbs lists none)");
  }
  std::unique_ptr<QueuePair> qp(new QueuePair());
  ibv_port_attr port_attributes;
  int port = 0;
  std::string names;
  for (int i = 0; i < count && qp->context_ == nullptr; ++i) {
    const std::string name = ibv_get_device_name(devices[i]);
    absl::StrAppend(&names, names.empty() ? "" : ", ", name);
    if (!device.empty() && name != device) continue;
    ibv_context* context = ibv_open_device(devices[i]);
    if (context == nullptr) continue;
    port = ActivePort(context, &port_attributes);
    if (port == 0) {
      ibv_close_device(context);
      continue;
    }
    qp->context_ = context;
  }
  ibv_free_device_list(devices);
  if (qp->context_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("rdma: no ", device.empty() ? "" : device + " ",
                                                      "device with an active port (devices: ", names, ")"));
  }
  qp->pd_ = ibv_alloc_pd(qp->context_);
  if (qp->pd_ == nullptr) return absl::UnavailableError(absl::StrCat("rdma: ibv_alloc_pd: ", Errno(errno)));
  qp->cq_ = ibv_create_cq(qp->context_, 256, nullptr, nullptr, 0);
  if (qp->cq_ == nullptr) return absl::UnavailableError(absl::StrCat("rdma: ibv_create_cq: ", Errno(errno)));
  ibv_qp_init_attr init = {};
  init.send_cq = qp->cq_;
  init.recv_cq = qp->cq_;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 256;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  qp->qp_ = ibv_create_qp(qp->pd_, &init);
  if (qp->qp_ == nullptr) return absl::UnavailableError(absl::StrCat("rdma: ibv_create_qp: ", Errno(errno)));

  ibv_qp_attr attributes = {};
  attributes.qp_state = IBV_QPS_INIT;
  attributes.pkey_index = 0;
  attributes.port_num = static_cast<uint8_t>(port);
  attributes.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(qp->qp_, &attributes, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    return absl::UnavailableError(absl::StrCat("rdma: queue pair to INIT: ", Errno(errno)));
  }
  Endpoint& local = qp->local_;
  local.qpn = qp->qp_->qp_num;
  local.psn = std::random_device()() & 0xffffff;
  local.lid = port_attributes.lid;
  local.port = static_cast<uint8_t>(port);
  local.gid_index = static_cast<uint8_t>(GidIndex());
  local.mtu = port_attributes.active_mtu;
  ibv_gid gid;
  if (ibv_query_gid(qp->context_, local.port, local.gid_index, &gid) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("rdma: port ", port, " has no GID ", local.gid_index,
                                                      " (set LAMINA_RDMA_GID_INDEX)"));
  }
  std::memcpy(local.gid.data(), gid.raw, local.gid.size());
  return qp;
}

QueuePair::~QueuePair() {
  if (qp_ != nullptr) ibv_destroy_qp(qp_);
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (context_ != nullptr) ibv_close_device(context_);
}

absl::Status QueuePair::Connect(const Endpoint& peer) {
  ibv_qp_attr rtr = {};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = static_cast<ibv_mtu>(std::min(local_.mtu, peer.mtu));
  rtr.dest_qp_num = peer.qpn;
  rtr.rq_psn = peer.psn;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.port_num = local_.port;
  rtr.ah_attr.dlid = peer.lid;
  // Routed by GID (RoCE, or InfiniBand across subnets) when the peer has no LID.
  if (peer.lid == 0) {
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, peer.gid.data(), peer.gid.size());
    rtr.ah_attr.grh.sgid_index = local_.gid_index;
    rtr.ah_attr.grh.hop_limit = 64;
  }
  if (ibv_modify_qp(qp_, &rtr,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    return absl::UnavailableError(absl::StrCat("rdma: queue pair to RTR (peer qpn ", peer.qpn, "): ", Errno(errno)));
  }
  ibv_qp_attr rts = {};
  rts.qp_state = IBV_QPS_RTS;
  rts.sq_psn = local_.psn;
  rts.timeout = 14;
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;
  rts.max_rd_atomic = 1;
  if (ibv_modify_qp(qp_, &rts,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    return absl::UnavailableError(absl::StrCat("rdma: queue pair to RTS: ", Errno(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<MemoryRegion> QueuePair::RegisterGpu(void* data, size_t bytes) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &entry, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      entry == nullptr) {
    return absl::FailedPreconditionError("rdma: this CUDA driver cannot export GPU memory as a dmabuf");
  }
  int fd = -1;
  const CUresult exported = reinterpret_cast<GetHandleFn>(entry)(&fd, reinterpret_cast<CUdeviceptr>(data), bytes,
                                                                 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (exported != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("rdma: GPU memory could not be exported as a dmabuf (CUresult ", exported,
                     "; it needs a 2 MiB-aligned range and an open kernel driver)"));
  }
  MemoryRegion region;
  region.mr_.reset(ibv_reg_dmabuf_mr(pd_, 0, bytes, reinterpret_cast<uint64_t>(data), fd,
                                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  const int error = errno;
  close(fd);
  if (!region.mr_) {
    return absl::FailedPreconditionError(absl::StrCat("rdma: registering GPU memory for GPUDirect RDMA: ", Errno(error)));
  }
  return region;
}

absl::StatusOr<MemoryRegion> QueuePair::RegisterHost(void* data, size_t bytes) {
  MemoryRegion region;
  region.mr_.reset(ibv_reg_mr(pd_, data, bytes, IBV_ACCESS_LOCAL_WRITE));
  if (!region.mr_) return absl::UnavailableError(absl::StrCat("rdma: registering host memory: ", Errno(errno)));
  return region;
}

absl::Status QueuePair::Write(const MemoryRegion& region, const void* local, size_t bytes, const RemoteBuffer& remote,
                              uint64_t offset, bool signaled) {
  if (offset + bytes > remote.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rdma: a write of ", bytes, " bytes at ", offset,
                                                   " overruns the peer's ", remote.bytes));
  }
  ibv_sge sge = {};
  sge.addr = reinterpret_cast<uint64_t>(local);
  sge.length = static_cast<uint32_t>(bytes);
  sge.lkey = region.lkey();
  ibv_send_wr wr = {};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.wr.rdma.remote_addr = remote.address + offset;
  wr.wr.rdma.rkey = remote.rkey;
  ibv_send_wr* bad = nullptr;
  const int error = ibv_post_send(qp_, &wr, &bad);
  if (error != 0) return absl::UnavailableError(absl::StrCat("rdma: ibv_post_send: ", Errno(error)));
  return absl::OkStatus();
}

absl::Status QueuePair::AwaitCompletion(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  ibv_wc wc;
  while (true) {
    const int n = ibv_poll_cq(cq_, 1, &wc);
    if (n < 0) return absl::UnavailableError("rdma: ibv_poll_cq failed");
    if (n == 1) {
      if (wc.status == IBV_WC_SUCCESS) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat("rdma: a write failed: ", ibv_wc_status_str(wc.status)));
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("rdma: a write did not complete within ", absl::FormatDuration(timeout)));
    }
  }
}

}  // namespace lamina::rdma
