// A compute node's own KV pool (`kv_capacity_tokens` on its topology entry): the memory node's
// AttentionExecutor on the compute node's device, shared by the node's batch runners and by the
// lamina.v1.MemoryNode service the coordinator frees and forks through.
// Thread-safe: every use of the executor holds the pool's lock (With).
#ifndef LAMINA_COMPUTE_NODE_LOCAL_LOCAL_POOL_H_
#define LAMINA_COMPUTE_NODE_LOCAL_LOCAL_POOL_H_

#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/threading/thread_pool.h"
#include "kv/attention/attention_executor.h"

namespace lamina {

class LocalPool {
 public:
  // The pool holds `options.num_layers` of the model's layers from `first_layer` (a node of a
  // layer split holds those it attends): the executor's layer l is the model's first_layer + l.
  static absl::StatusOr<std::unique_ptr<LocalPool>> Create(const AttentionExecutorOptions& options,
                                                           ThreadPool* pool = &ThreadPool::Default(),
                                                           int64_t first_layer = 0);

  // Runs `f(AttentionExecutor&)` holding the pool's lock; returns what it returns.
  template <typename F>
  auto With(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f(*executor_);
  }
  // The GPU the pool lives on; -1 on the CPU.
  int device() const { return device_; }
  const AttentionExecutorOptions& options() const { return options_; }
  // The model's layer the executor's layer 0 is.
  int64_t first_layer() const { return first_layer_; }
  // The executor and its lock, for a service that takes both (kv/service/kv_pool_service.h).
  AttentionExecutor* executor() { return executor_.get(); }
  std::mutex* mu() { return &mu_; }

 private:
  LocalPool(const AttentionExecutorOptions& options, std::unique_ptr<AttentionExecutor> executor, int64_t first_layer)
      : options_(options), device_(options.cuda_device), first_layer_(first_layer), executor_(std::move(executor)) {}

  const AttentionExecutorOptions options_;
  const int device_;
  const int64_t first_layer_;
  std::mutex mu_;
  std::unique_ptr<AttentionExecutor> executor_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_LOCAL_LOCAL_POOL_H_
