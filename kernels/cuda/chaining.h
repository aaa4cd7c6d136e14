// Kernel chaining: programmatic dependent launch (Hopper and later). A chained kernel may start
// while the kernel before it in its stream is still running: its blocks take the SMs that kernel
// leaves free, read what does not depend on it (weights), and wait for it to finish, with all its
// writes visible, before touching anything else (kernels/cuda/chaining.cuh says how a kernel
// takes part). At small batch a decode step is a chain of several hundred short kernels, and each
// launch's start-up and tail then hide behind its neighbours.
// On by default; the switch is for benchmarks that compare with and without, and a launch reads
// it when queued (a CUDA graph keeps what its capture saw). Thread-safe.
#ifndef LAMINA_KERNELS_CUDA_CHAINING_H_
#define LAMINA_KERNELS_CUDA_CHAINING_H_

namespace lamina::kernels::cuda {

void SetKernelChaining(bool on);
bool KernelChaining();

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_CHAINING_H_
