#include "compute_node/tensor_parallel/rank_group.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

// Message types. A part and its answer carry the step (tag) and the step's call (flags).
constexpr uint32_t kHello = 1;    // tag: the connecting rank
constexpr uint32_t kPart = 2;     // a rank's part of a sum or a gather
constexpr uint32_t kTotal = 3;    // rank 0's answer
constexpr uint32_t kAbandon = 4;  // tag: a step the sender abandoned

ByteSpan Bytes(const void* data, size_t bytes) { return ByteSpan(static_cast<const uint8_t*>(data), bytes); }

}  // namespace

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Join(Transport* transport, int rank, int size,
                                                           const std::string& leader_address, absl::Duration timeout,
                                                           absl::Time deadline) {
  if (rank < 0 || rank >= size) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", size));
  std::unique_ptr<RankGroup> group(new RankGroup(rank, size, timeout));
  if (rank > 0) {
    absl::StatusOr<std::unique_ptr<Connection>> connection;
    // Rank 0 may not listen yet: try until the deadline.
    for (;;) {
      connection = transport->Connect(leader_address, deadline);
      if (connection.ok() || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (!connection.ok()) {
      return absl::UnavailableError(absl::StrCat("rank ", rank, " could not reach rank 0 of its tensor-parallel group at ",
                                                 leader_address, ": ", connection.status().message()));
    }
    LAMINA_RETURN_IF_ERROR((*connection)->Send({kHello, 0, static_cast<uint64_t>(rank)}, {}));
    group->peers_.push_back(std::move(*connection));
    return group;
  }
  LAMINA_ASSIGN_OR_RETURN(group->listener_, transport->Listen(leader_address));
  group->peers_.resize(size - 1);
  group->parts_.resize(size - 1);
  for (int joined = 1; joined < size;) {
    absl::StatusOr<std::unique_ptr<Connection>> connection = group->listener_->Accept(deadline);
    if (!connection.ok()) {
      return absl::Status(connection.status().code(),
                          absl::StrCat("rank 0 waited for its tensor-parallel group's ", size - 1, " other ranks; ",
                                       joined - 1, " joined: ", connection.status().message()));
    }
    MessageHeader hello;
    std::vector<uint8_t> payload;
    if (!(*connection)->Receive(&hello, &payload, deadline).ok() || hello.type != kHello || hello.tag < 1 ||
        hello.tag >= static_cast<uint64_t>(size) || group->peers_[hello.tag - 1] != nullptr) {
      continue;  // not one of the group's ranks (or a repeat): ignored
    }
    group->peers_[hello.tag - 1] = std::move(*connection);
    ++joined;
  }
  return group;
}

void RankGroup::BeginStep(uint64_t step) {
  step_ = step;
  call_ = 0;
}

void RankGroup::AbandonStep() {
  // Best effort: a peer that cannot be told has failed, and its own calls say so.
  for (const std::unique_ptr<Connection>& peer : peers_) {
    if (peer) peer->Send({kAbandon, 0, step_}, {}).IgnoreError();
  }
}

absl::Status RankGroup::Collect(size_t bytes) {
  const absl::Time deadline = absl::Now() + timeout_;
  for (int r = 1; r < size_; ++r) {
    for (;;) {
      MessageHeader header;
      absl::Status received = peers_[r - 1]->Receive(&header, &parts_[r - 1], deadline);
      if (!received.ok()) {
        return absl::Status(received.code(), absl::StrCat("tensor-parallel rank ", r, ": ", received.message()));
      }
      if (header.type == kAbandon && header.tag == step_) {
        return absl::AbortedError(absl::StrCat("tensor-parallel rank ", r, " abandoned step ", step_));
      }
      if (header.type != kPart || header.tag < step_) continue;  // left by an abandoned step (its sender was told)
      if (header.tag != step_ || header.flags != call_) {
        return absl::DataLossError(absl::StrCat("tensor-parallel rank ", r, " is at step ", header.tag, ", call ",
                                                header.flags, "; rank 0 at step ", step_, ", call ", call_));
      }
      break;
    }
    if (parts_[r - 1].size() != bytes) {
      return absl::InternalError(absl::StrCat("tensor-parallel rank ", r, " sent ", parts_[r - 1].size(),
                                              " bytes where ", bytes, " were due: do the ranks run the same plans?"));
    }
  }
  return absl::OkStatus();
}

absl::Status RankGroup::Exchange(const void* data, size_t bytes) {
  const ByteSpan part = Bytes(data, bytes);
  LAMINA_RETURN_IF_ERROR(peers_[0]->Send({kPart, call_, step_}, {&part, 1}));
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    MessageHeader header;
    LAMINA_RETURN_IF_ERROR(peers_[0]->Receive(&header, &reply_, deadline));
    if (header.type == kAbandon && header.tag == step_) {
      return absl::AbortedError(absl::StrCat("tensor-parallel rank 0 abandoned step ", step_));
    }
    if (header.type == kTotal && header.tag == step_ && header.flags == call_) return absl::OkStatus();
    // Anything else was left by a step abandoned earlier.
  }
}

absl::Status RankGroup::SendToAll(const float* data, size_t count) {
  for (int r = 1; r < size_; ++r) {
    const ByteSpan part = Bytes(data, count * sizeof(float));
    LAMINA_RETURN_IF_ERROR(peers_[r - 1]->Send({kTotal, call_, step_}, {&part, 1}));
  }
  return absl::OkStatus();
}

absl::Status RankGroup::AllReduceSum(absl::Span<float> data) {
  if (size_ == 1) return absl::OkStatus();
  const size_t bytes = data.size() * sizeof(float);
  if (rank_ > 0) {
    LAMINA_RETURN_IF_ERROR(Exchange(data.data(), bytes));
    if (reply_.size() != bytes) return absl::InternalError("tensor-parallel rank 0 answered a sum with the wrong size");
    std::memcpy(data.data(), reply_.data(), bytes);
    ++call_;
    return absl::OkStatus();
  }
  LAMINA_RETURN_IF_ERROR(Collect(bytes));
  for (int r = 1; r < size_; ++r) {
    const float* part = reinterpret_cast<const float*>(parts_[r - 1].data());
    for (size_t i = 0; i < data.size(); ++i) data[i] += part[i];
  }
  LAMINA_RETURN_IF_ERROR(SendToAll(data.data(), data.size()));
  ++call_;
  return absl::OkStatus();
}

absl::Status RankGroup::AllGather(absl::Span<const float> mine, absl::Span<float> all) {
  if (all.size() != mine.size() * static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError("a gather's output must hold every rank's part");
  }
  if (size_ == 1) {
    std::memcpy(all.data(), mine.data(), mine.size() * sizeof(float));
    return absl::OkStatus();
  }
  const size_t bytes = mine.size() * sizeof(float);
  if (rank_ > 0) {
    LAMINA_RETURN_IF_ERROR(Exchange(mine.data(), bytes));
    if (reply_.size() != all.size() * sizeof(float)) {
      return absl::InternalError("tensor-parallel rank 0 answered a gather with the wrong size");
    }
    std::memcpy(all.data(), reply_.data(), reply_.size());
    ++call_;
    return absl::OkStatus();
  }
  LAMINA_RETURN_IF_ERROR(Collect(bytes));
  std::memcpy(all.data(), mine.data(), bytes);
  for (int r = 1; r < size_; ++r) std::memcpy(all.data() + r * mine.size(), parts_[r - 1].data(), bytes);
  LAMINA_RETURN_IF_ERROR(SendToAll(all.data(), all.size()));
  ++call_;
  return absl::OkStatus();
}

}  // namespace lamina
