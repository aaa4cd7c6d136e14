#include "common/threading/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace lamina {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    const char* env = std::getenv("LAMINA_NUM_THREADS");
    return new ThreadPool(env ? std::atoi(env) : 0);
  }();
  return *pool;
}

// Indices are handed out one at a time under the lock: callers pass coarse work items (a block of
// output columns, a head), so the lock is taken a few dozen times per call, not per element.
void ThreadPool::RunChunks() {
  std::unique_lock<std::mutex> lock(mu_);
  while (fn_ != nullptr && next_ < total_) {
    int64_t index = next_++;
    const auto* fn = fn_;
    lock.unlock();
    (*fn)(index);
    lock.lock();
    if (++finished_ == total_) work_done_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_ready_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    total_ = n;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  work_ready_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mu_);
  work_done_.wait(lock, [&] { return finished_ == total_; });
  fn_ = nullptr;
}

}  // namespace lamina
