#include "common/transport/peer_watch.h"

#include <chrono>
#include <cstdio>
#include <utility>

namespace lamina {

PeerWatch::~PeerWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PeerWatch::Arm(std::vector<Watched> watched) {
  std::lock_guard<std::mutex> lock(mu_);
  watched_ = std::move(watched);
  armed_ = true;
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  changed_.notify_all();
}

void PeerWatch::Disarm() {
  // The thread looks at the connections under the lock, so once it is ours they are left alone.
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  watched_.clear();
}

int PeerWatch::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

void PeerWatch::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (!armed_) {
      changed_.wait(lock, [this] { return stopping_ || armed_; });
      continue;
    }
    for (size_t i = 0; i < watched_.size();) {
      const Watched& w = watched_[i];
      if (!w.connection->PeerClosed()) {
        ++i;
        continue;
      }
      const absl::Status aborted = w.abort();
      if (aborted.ok()) {
        std::fprintf(stderr, "%s closed its connection mid-step: the step's waits for it end now\n", w.what.c_str());
      } else {
        std::fprintf(stderr,
                     "%s closed its connection mid-step; its waits end at their timeout, as the abort failed: %s\n",
                     w.what.c_str(), aborted.ToString().c_str());
      }
      ++aborted_;
      watched_.erase(watched_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    changed_.wait_for(lock, std::chrono::microseconds(absl::ToInt64Microseconds(period_)),
                      [this] { return stopping_ || !armed_; });
  }
}

}  // namespace lamina
