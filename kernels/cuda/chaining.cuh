// How a kernel takes part in a chain (chaining.h), and the launch that chains it.
//
// A kernel launched with LaunchChained must, in every block:
//   1. call LetNextKernelStart() first, so that the next chained kernel may be scheduled as soon as
//      every block of this one has started;
//   2. read nothing but constant data (weights, tables written before the step) and write nothing
//      at all before WaitForPreviousKernel(), which returns once the kernel before it in the stream
//      has finished and its writes are visible.
// Every chained kernel waits, so each one's end implies the end of all before it: a kernel two
// places later can rely on both. Kernels that are not launched chained (cuBLAS, the data plane's
// waits) are ordered as always, and a chained kernel after one of them starts when it has ended,
// or earlier where that kernel lets it (the data plane's waits, data_plane.h), still waiting for
// its end in WaitForPreviousKernel().
// Without the launch attribute both calls do nothing, so chained kernels may be launched plainly.
// Only the dependent launch lets a block wait on another grid, and it does so only once all blocks
// of that grid are on the GPU: a chain cannot deadlock.
#ifndef LAMINA_KERNELS_CUDA_CHAINING_CUH_
#define LAMINA_KERNELS_CUDA_CHAINING_CUH_

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/chaining.h"

namespace lamina::kernels::cuda {

__device__ __forceinline__ void LetNextKernelStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void WaitForPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Both, for a kernel with nothing to do before its inputs are ready.
__device__ __forceinline__ void StartChained() {
  LetNextKernelStart();
  WaitForPreviousKernel();
}

// LaunchChained (below) with the grid in clusters of `cluster_blocks` blocks along x (Hopper
// thread block clusters, whose blocks share their shared memory); 0: no cluster launch.
template <typename... Params, typename... Args>
cudaError_t LaunchChainedInClusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                    unsigned cluster_blocks, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = KernelChaining() ? 1 : 0;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster_blocks;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster_blocks > 0 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Queues `kernel` on `stream` like kernel<<<grid, block, shared_bytes, stream>>>(args...), chained
// to the kernel before it when KernelChaining() is on. Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t LaunchChained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args&&... args) {
  return LaunchChainedInClusters(kernel, grid, block, shared_bytes, 0, stream, std::forward<Args>(args)...);
}

// Queues `kernel` on `stream` as a programmatic dependent of the kernel before it when `early`,
// whatever KernelChaining() says, and plainly otherwise: for the data plane's kernels, whose early
// start is on a hop's path (data_plane.cu, packets.cu). Such a kernel waits for the one before it
// (WaitForPreviousKernel) before reading what that one wrote. Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, bool early,
                            Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = early ? 1 : 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_CHAINING_CUH_
