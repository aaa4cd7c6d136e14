#include "common/threading/quiescent_release.h"

#include <utility>

namespace lamina {

QuiescentRelease& QuiescentRelease::Process() {
  static QuiescentRelease* const process = new QuiescentRelease();
  return *process;
}

void QuiescentRelease::BeginStep() {
  std::unique_lock<std::mutex> lock(mu_);
  released_.wait(lock, [&] { return !releasing_; });
  ++running_;
}

void QuiescentRelease::EndStep() {
  std::unique_lock<std::mutex> lock(mu_);
  --running_;
  ReleaseWhileQuiet(lock);
}

void QuiescentRelease::RetireShared(std::shared_ptr<void> object) {
  std::unique_lock<std::mutex> lock(mu_);
  waiting_.push_back(std::move(object));
  // While another thread destroys, it takes this one too.
  if (!releasing_) ReleaseWhileQuiet(lock);
}

void QuiescentRelease::ReleaseWhileQuiet(std::unique_lock<std::mutex>& lock) {
  if (running_ > 0 || releasing_ || waiting_.empty()) return;
  releasing_ = true;  // no step begins until the objects are gone
  while (!waiting_.empty()) {
    std::vector<std::shared_ptr<void>> doomed;
    doomed.swap(waiting_);
    lock.unlock();
    doomed.clear();  // a destructor may retire more, taken by the next round
    lock.lock();
  }
  releasing_ = false;
  released_.notify_all();
}

int QuiescentRelease::running_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

size_t QuiescentRelease::retired_objects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size();
}

}  // namespace lamina
