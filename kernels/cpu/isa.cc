#include "kernels/cpu/isa.h"

#include <algorithm>
#include <atomic>

namespace lamina::kernels::cpu {
namespace {

#if defined(__clang__)
// clang 14 knows no "x86-64-vN" levels here: the features that make them up (the fuzzing builds).
bool SupportsV3() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2");
}
bool SupportsV4() {
  return SupportsV3() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
#else
bool SupportsV3() { return __builtin_cpu_supports("x86-64-v3"); }
bool SupportsV4() { return __builtin_cpu_supports("x86-64-v4"); }
#endif

Isa Detect() {
  __builtin_cpu_init();
  if (SupportsV4()) return Isa::kAvx512;
  if (SupportsV3()) return Isa::kAvx2;
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
