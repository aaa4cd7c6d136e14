#include "kernels/cuda/chaining.h"

#include <atomic>

namespace lamina::kernels::cuda {
namespace {

std::atomic<bool> chaining{true};

}  // namespace

void SetKernelChaining(bool on) { chaining.store(on, std::memory_order_relaxed); }

bool KernelChaining() { return chaining.load(std::memory_order_relaxed); }

}  // namespace lamina::kernels::cuda
