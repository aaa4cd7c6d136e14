// A fixed pool of worker threads for data-parallel loops.
// Thread-safe. ParallelFor blocks until every index has run; concurrent callers (two memory nodes
// in one test process, say) take turns.
#ifndef LAMINA_COMMON_THREADING_THREAD_POOL_H_
#define LAMINA_COMMON_THREADING_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace lamina {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread, which also does work; 0 means one per core.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for i in [0, n), spread over the threads. fn must not call ParallelFor.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  // The process-wide pool the CPU kernels use (one thread per core, or LAMINA_NUM_THREADS).
  static ThreadPool& Default();

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time
  std::mutex mu_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_THREADING_THREAD_POOL_H_
