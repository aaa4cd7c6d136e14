#include "compute_node/local/local_pool.h"

#include "common/status/status_macros.h"

namespace lamina {

absl::StatusOr<std::unique_ptr<LocalPool>> LocalPool::Create(const AttentionExecutorOptions& options,
                                                              ThreadPool* pool, int64_t first_layer) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<AttentionExecutor> executor, AttentionExecutor::Create(options, pool));
  return std::unique_ptr<LocalPool>(new LocalPool(options, std::move(executor), first_layer));
}

}  // namespace lamina
