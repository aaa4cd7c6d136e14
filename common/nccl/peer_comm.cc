#include "common/nccl/peer_comm.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"

namespace lamina::nccl {
namespace {

constexpr absl::Duration kPoll = absl::Microseconds(200);

}  // namespace

absl::StatusOr<std::string> NewCommId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("nccl: no communicator id (", ncclGetErrorString(result), ")"));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<PeerComm>> PeerComm::Start(const std::string& id, int rank, int device,
                                                          absl::Duration join_timeout, absl::Duration timeout) {
  ncclUniqueId unique;
  if (id.size() != sizeof(unique)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: a communicator id has ", sizeof(unique), " bytes, not ",
                                                   id.size()));
  }
  if (rank != 0 && rank != 1) return absl::InvalidArgumentError(absl::StrCat("nccl: rank ", rank, " of 2"));
  std::copy(id.begin(), id.end(), reinterpret_cast<char*>(&unique));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<PeerComm> comm(new PeerComm(rank, device, join_timeout, timeout));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&comm->own_stream_, cudaStreamNonBlocking));
  LAMINA_CUDA_RETURN_IF_ERROR(cudaMalloc(&comm->scratch_, 2 * sizeof(float)));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // the join finishes in the background; Run() watches it
  const ncclResult_t result = ncclCommInitRankConfig(&comm->comm_, 2, unique, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    comm->comm_ = nullptr;
    return comm->NcclError("joining the communicator", result);
  }
  comm->thread_ = std::thread([c = comm.get()] { c->Run(); });
  return comm;
}

PeerComm::~PeerComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  cudaSetDevice(device_);
  if (comm_ != nullptr) ncclCommAbort(comm_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  for (const Watched& w : watched_) {
    cudaEventDestroy(w.begin);
    if (w.end != nullptr) cudaEventDestroy(w.end);
  }
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  if (own_stream_ != nullptr) cudaStreamDestroy(own_stream_);
}

absl::Status PeerComm::NcclError(const char* what, ncclResult_t result) {
  const char* detail = comm_ != nullptr ? ncclGetLastError(comm_) : "";
  return absl::UnavailableError(absl::StrCat("nccl: ", what, ": ", ncclGetErrorString(result),
                                             detail != nullptr && *detail != '\0' ? absl::StrCat(" (", detail, ")") : ""));
}

void PeerComm::FailLocked(absl::Status status) {
  if (!status_.ok()) return;
  status_ = std::move(status);
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  changed_.notify_all();
}

bool PeerComm::Nap(std::unique_lock<std::mutex>& lock, absl::Duration d) {
  changed_.wait_for(lock, std::chrono::microseconds(absl::ToInt64Microseconds(d)), [this] { return stopping_; });
  return !stopping_;
}

ncclResult_t PeerComm::Settle(ncclResult_t result) {
  const absl::Time give_up = absl::Now() + timeout_;
  while (result == ncclInProgress && comm_ != nullptr && absl::Now() < give_up) {
    if (ncclCommGetAsyncError(comm_, &result) != ncclSuccess) return ncclInternalError;
  }
  return result == ncclInProgress ? ncclInternalError : result;
}

absl::Status PeerComm::FirstExchange() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) return status_;
    ncclResult_t result = ncclGroupStart();
    if (result == ncclSuccess) result = ncclSend(scratch_, 1, ncclFloat, 1 - rank_, comm_, own_stream_);
    if (result == ncclSuccess || result == ncclInProgress) {
      result = ncclRecv(scratch_ + 1, 1, ncclFloat, 1 - rank_, comm_, own_stream_);
    }
    result = Settle(ncclGroupEnd());
    if (result != ncclSuccess) return NcclError("the first exchange", result);
  }
  const absl::Time give_up = absl::Now() + join_timeout_;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const cudaError_t done = cudaStreamQuery(own_stream_);
    if (done == cudaSuccess) return absl::OkStatus();
    if (done != cudaErrorNotReady) return cuda::CudaStatus(done, "the first exchange", __FILE__);
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("nccl: the peer did not exchange within ", absl::FormatDuration(join_timeout_)));
    }
    if (!Nap(lock, kPoll)) return absl::CancelledError("nccl: closed while joining");
  }
}

void PeerComm::Run() {
  cudaSetDevice(device_);
  // The join.
  const absl::Time give_up = absl::Now() + join_timeout_;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) return FailLocked(NcclError("joining the communicator", state));
      if (absl::Now() > give_up) {
        return FailLocked(absl::DeadlineExceededError(
            absl::StrCat("nccl: the peer did not join within ", absl::FormatDuration(join_timeout_))));
      }
      if (!Nap(lock, absl::Milliseconds(1))) return;
    }
  }
  absl::Status first = FirstExchange();
  std::unique_lock<std::mutex> lock(mu_);
  if (!first.ok()) return FailLocked(std::move(first));
  ready_ = true;
  changed_.notify_all();

  // The watchdog.
  while (!stopping_ && status_.ok()) {
    if (watched_.empty()) {
      changed_.wait(lock, [this] { return stopping_ || !watched_.empty(); });
      continue;
    }
    absl::Status checked = CheckWatchedLocked();
    if (!checked.ok()) return FailLocked(std::move(checked));
    Nap(lock, kPoll);
  }
}

absl::Status PeerComm::CheckWatchedLocked() {
  while (!watched_.empty()) {
    Watched& w = watched_.front();
    if (w.reached == absl::InfiniteFuture()) {
      const cudaError_t reached = cudaEventQuery(w.begin);
      if (reached == cudaErrorNotReady) return absl::OkStatus();  // the stream is busy before it
      if (reached != cudaSuccess) return cuda::CudaStatus(reached, "a watched exchange", __FILE__);
      w.reached = absl::Now();
    }
    if (w.end == nullptr) return absl::OkStatus();  // still being queued
    const cudaError_t done = cudaEventQuery(w.end);
    if (done == cudaSuccess) {
      spare_events_.push_back(w.begin);
      spare_events_.push_back(w.end);
      watched_.pop_front();
      continue;
    }
    if (done != cudaErrorNotReady) return cuda::CudaStatus(done, "a watched exchange", __FILE__);
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      return NcclError("a queued exchange", state);
    }
    if (absl::Now() - w.reached > timeout_) {
      return absl::DeadlineExceededError(
          absl::StrCat("nccl: the peer's data did not arrive within ", absl::FormatDuration(timeout_)));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status PeerComm::AwaitReady() {
  std::unique_lock<std::mutex> lock(mu_);
  // The background thread gives up after the timeout; a little more here covers its last poll.
  const bool settled =
      changed_.wait_for(lock, std::chrono::microseconds(absl::ToInt64Microseconds(2 * join_timeout_ + absl::Seconds(1))),
                        [this] { return ready_ || !status_.ok(); });
  if (!status_.ok()) return status_;
  if (!settled) return absl::DeadlineExceededError("nccl: the communicator did not come up");
  return absl::OkStatus();
}

absl::Status PeerComm::Send(const float* data, int64_t count, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return status_;
  if (!ready_) return absl::FailedPreconditionError("nccl: send before the communicator is up");
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const ncclResult_t result =
      Settle(ncclSend(data, static_cast<size_t>(count), ncclFloat, 1 - rank_, comm_, stream));
  if (result != ncclSuccess) {
    FailLocked(NcclError("send", result));
    return status_;
  }
  return absl::OkStatus();
}

absl::Status PeerComm::Recv(float* data, int64_t count, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return status_;
  if (!ready_) return absl::FailedPreconditionError("nccl: receive before the communicator is up");
  LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const ncclResult_t result =
      Settle(ncclRecv(data, static_cast<size_t>(count), ncclFloat, 1 - rank_, comm_, stream));
  if (result != ncclSuccess) {
    FailLocked(NcclError("receive", result));
    return status_;
  }
  return absl::OkStatus();
}

absl::StatusOr<cudaEvent_t> PeerComm::RecordLocked(cudaStream_t stream) {
  cudaEvent_t event;
  if (spare_events_.empty()) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  } else {
    event = spare_events_.back();
    spare_events_.pop_back();
  }
  const cudaError_t recorded = cudaEventRecord(event, stream);
  if (recorded != cudaSuccess) {
    spare_events_.push_back(event);
    return cuda::CudaStatus(recorded, "cudaEventRecord", __FILE__);
  }
  return event;
}

absl::Status PeerComm::BeginWatch(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return status_;
  if (!watched_.empty() && watched_.back().end == nullptr) {
    // The last piece of work was left unclosed (its queueing failed part way): it ends here.
    LAMINA_ASSIGN_OR_RETURN(watched_.back().end, RecordLocked(stream));
  }
  LAMINA_ASSIGN_OR_RETURN(cudaEvent_t begin, RecordLocked(stream));
  watched_.push_back({begin, nullptr, absl::InfiniteFuture()});
  return absl::OkStatus();
}

absl::Status PeerComm::EndWatch(cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status_.ok()) return status_;
    if (watched_.empty() || watched_.back().end != nullptr) {
      return absl::FailedPreconditionError("nccl: EndWatch without BeginWatch");
    }
    LAMINA_ASSIGN_OR_RETURN(watched_.back().end, RecordLocked(stream));
  }
  changed_.notify_all();
  return absl::OkStatus();
}

void PeerComm::Abort(absl::Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  cudaSetDevice(device_);
  FailLocked(std::move(why));
}

absl::Status PeerComm::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

}  // namespace lamina::nccl
