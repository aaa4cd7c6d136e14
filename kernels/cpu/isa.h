// The x86-64 instruction sets the CPU kernels are compiled for. The compute-bound kernels (matmul,
// attention) are built once for each, and every call runs the best one that the CPU supports,
// unless a test or benchmark has limited it (LimitIsa). Results may differ between instruction
// sets by float rounding: wider vectors sum in another order.
#ifndef LAMINA_KERNELS_CPU_ISA_H_
#define LAMINA_KERNELS_CPU_ISA_H_

namespace lamina::kernels::cpu {

enum class Isa {
  kBaseline,  // x86-64: SSE2, eight floats as a pair of registers
  kAvx2,      // x86-64-v3: AVX2 and FMA, eight floats a register
  kAvx512,    // x86-64-v4: AVX-512, sixteen floats a register
};

// The best instruction set this CPU supports. Thread-safe.
Isa BestIsa();

// The instruction set the kernels run now: BestIsa(), or less once LimitIsa has been called.
// Thread-safe.
Isa ActiveIsa();

// Runs the kernels as on a CPU with at most `most`, for tests and benchmarks that compare the
// instruction sets on one machine. Thread-safe; calls already running finish as they began.
void LimitIsa(Isa most);

// "baseline", "avx2" or "avx512".
const char* IsaName(Isa isa);

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_ISA_H_
