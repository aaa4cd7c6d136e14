// What the GPU benchmarks share: the best plain read rate of this GPU (the baseline every
// memory-bound figure is a ratio against) and event timing of a queued piece of work.
#ifndef LAMINA_TESTS_BENCH_GPU_TIMING_H_
#define LAMINA_TESTS_BENCH_GPU_TIMING_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::bench {

// Bytes per second of the fastest of a few plain read kernels over a 2 GiB buffer.
absl::StatusOr<double> BestReadRate(cudaStream_t stream);

// The median milliseconds of `runs` executions of `work` (which queues on `stream`), after warm-up.
absl::StatusOr<double> MedianMs(const std::function<absl::Status()>& work, cudaStream_t stream, int runs = 50);

// The milliseconds of one execution of `work` among `calls` queued back to back in a CUDA graph,
// as the kernels of a decode step run (the median of `runs` launches of the graph, over `calls`):
// the host's launch latency is not counted, and a chained kernel may start (not yet read its
// inputs) while the one before it ends.
absl::StatusOr<double> GraphedMs(const std::function<absl::Status()>& work, cudaStream_t stream, int calls = 20,
                                 int runs = 11);

// Keeps `stream` busy for `ns` nanoseconds on its GPU's clock (one thread spinning): a stand-in
// for work queued between timed pieces, such as a compute node's slices between two layers' hops.
absl::Status QueueBusyWait(int64_t ns, cudaStream_t stream);

// Measures BestReadRate on device 0 and prints "<GPU>, <n> SMs: best plain read rate in this run
// <r> TB/s", the line every GPU benchmark opens with; returns the rate.
absl::StatusOr<double> ReportReadRate(cudaStream_t stream);

// A benchmark program's main: runs `run` on the arguments after the program's name and returns 0,
// or prints "<program>: <error>" on stderr and returns 1.
int BenchMain(const char* program, int argc, char** argv,
              const std::function<absl::Status(const std::vector<std::string>&)>& run);

}  // namespace lamina::bench

#endif  // LAMINA_TESTS_BENCH_GPU_TIMING_H_
