// A model's weights on one device ("cpu" or "cuda:N") and the compute engines that run over them.
// The compute node and single-process mode both build their engines here, so a GPU engine is the
// same in both: bf16 weights (the host copy dropped after upload), decode as CUDA graphs per
// batch-size bucket, tokens drawn on the device.
// Thread-compatible; the engines it makes each serve one caller at a time.
#ifndef LAMINA_COMPUTE_NODE_ENGINE_DEVICE_ENGINE_H_
#define LAMINA_COMPUTE_NODE_ENGINE_DEVICE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/attention/attention_service.h"
#include "common/cuda/device.h"
#include "common/threading/thread_pool.h"
#include "compute_node/engine/compute_engine.h"
#include "compute_node/model/model_weights.h"
#include "compute_node/tensor_parallel/rank_group.h"

namespace lamina {

class CudaModelWeights;

class DeviceWeights {
 public:
  // The checkpoint in `model_dir`, or with `random_seed` weights of its shape drawn from that seed
  // (on a GPU, drawn there); `share`'s tensors only. FailedPrecondition when the device cannot be
  // used here.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Load(const DeviceSpec& device, const std::string& model_dir,
                                                             std::optional<uint64_t> random_seed = std::nullopt,
                                                             const WeightShare& share = {});
  // Weights already in host memory, moved onto `device`.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> FromHost(const DeviceSpec& device,
                                                                 std::unique_ptr<ModelWeights> host);
  ~DeviceWeights();

  const ModelConfig& config() const;
  const DeviceSpec& device() const { return device_; }

  // A new engine over these weights reaching attention through `attention` (both must outlive it).
  // On the CPU, `pool` runs the kernels. `group`: the tensor-parallel group these weights are a
  // rank's share of (tensor_parallel/shard.h; must outlive the engine): CPU ranks only so far,
  // Unimplemented on a GPU.
  absl::StatusOr<std::unique_ptr<ComputeEngine>> MakeEngine(AttentionService* attention,
                                                            ThreadPool* pool = &ThreadPool::Default(),
                                                            RankGroup* group = nullptr) const;

 private:
  explicit DeviceWeights(const DeviceSpec& device);

  DeviceSpec device_;
  std::unique_ptr<ModelWeights> host_;      // on the CPU
  std::unique_ptr<CudaModelWeights> gpu_;  // on a GPU
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_ENGINE_DEVICE_ENGINE_H_
