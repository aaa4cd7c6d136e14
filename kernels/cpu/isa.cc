#include "kernels/cpu/isa.h"

#include <algorithm>
#include <atomic>

namespace lamina::kernels::cpu {
namespace {

Isa Detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return Isa::kAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return Isa::kAvx2;
  return Isa::kBaseline;
}

std::atomic<Isa> limit{Isa::kAvx512};

}  // namespace

Isa BestIsa() {
  static const Isa best = Detect();
  return best;
}

Isa ActiveIsa() { return std::min(BestIsa(), limit.load(std::memory_order_relaxed)); }

void LimitIsa(Isa most) { limit.store(most, std::memory_order_relaxed); }

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kBaseline:
      return "baseline";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

}  // namespace lamina::kernels::cpu
