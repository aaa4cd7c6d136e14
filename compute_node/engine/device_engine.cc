#include "compute_node/engine/device_engine.h"

#include "common/model_config/model_config.h"
#include "common/status/status_macros.h"
#include "compute_node/engine/cpu_slice_backend.h"
#ifdef LAMINA_HAVE_CUDA
#include "compute_node/engine/cuda/cuda_model_weights.h"
#include "compute_node/engine/cuda/cuda_slice_backend.h"
#endif

namespace lamina {

#ifndef LAMINA_HAVE_CUDA
class CudaModelWeights {};  // never made: UseDevice refuses CUDA devices in this build
#endif

DeviceWeights::DeviceWeights(const DeviceSpec& device) : device_(device) {}
DeviceWeights::~DeviceWeights() = default;

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Load(const DeviceSpec& device,
                                                                     const std::string& model_dir,
                                                                     std::optional<uint64_t> random_seed,
                                                                     const WeightShare& share) {
  LAMINA_RETURN_IF_ERROR(UseDevice(device));  // before the (long) load: a missing GPU fails fast
#ifdef LAMINA_HAVE_CUDA
  if (device.is_cuda && !random_seed) {  // straight to the GPU, without a float32 copy on the host
    std::unique_ptr<DeviceWeights> weights(new DeviceWeights(device));
    LAMINA_ASSIGN_OR_RETURN(weights->gpu_, CudaModelWeights::Load(model_dir, share));
    return weights;
  }
#endif
  if (!random_seed) {
    LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> host, ModelWeights::Load(model_dir, share));
    return FromHost(device, std::move(host));
  }
  LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
#ifdef LAMINA_HAVE_CUDA
  if (device.is_cuda) {
    std::unique_ptr<DeviceWeights> weights(new DeviceWeights(device));
    LAMINA_ASSIGN_OR_RETURN(weights->gpu_, CudaModelWeights::Random(config, *random_seed, share));
    return weights;
  }
#endif
  return FromHost(device, ModelWeights::Random(config, *random_seed, share));
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::FromHost(const DeviceSpec& device,
                                                                         std::unique_ptr<ModelWeights> host) {
  LAMINA_RETURN_IF_ERROR(UseDevice(device));
  std::unique_ptr<DeviceWeights> weights(new DeviceWeights(device));
#ifdef LAMINA_HAVE_CUDA
  if (device.is_cuda) {
    LAMINA_ASSIGN_OR_RETURN(weights->gpu_, CudaModelWeights::Upload(*host));
    return weights;  // the host copy is dropped
  }
#endif
  weights->host_ = std::move(host);
  return weights;
}

const ModelConfig& DeviceWeights::config() const {
#ifdef LAMINA_HAVE_CUDA
  if (gpu_) return gpu_->config;
#endif
  return host_->config;
}

absl::StatusOr<std::unique_ptr<ComputeEngine>> DeviceWeights::MakeEngine(AttentionService* attention,
                                                                          ThreadPool* pool, RankGroup* group) const {
  if (!device_.is_cuda) {
    return std::make_unique<ComputeEngine>(std::make_unique<CpuSliceBackend>(host_.get(), pool, group),
                                           std::make_unique<CpuSliceBackend>(host_.get(), pool, group), attention);
  }
  if (group != nullptr && group->size() > 1) {
    return absl::UnimplementedError("tensor parallelism runs on CPU ranks so far; a rank on a GPU is not built yet");
  }
#ifdef LAMINA_HAVE_CUDA
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaSliceBackend> prefill, CudaSliceBackend::Create(gpu_.get(), device_.index));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaSliceBackend> decode,
                          CudaSliceBackend::Create(gpu_.get(), device_.index, /*graphs=*/true));
  return std::make_unique<ComputeEngine>(std::move(prefill), std::move(decode), attention);
#else
  return UseDevice(device_);  // says this build has no CUDA
#endif
}

}  // namespace lamina
