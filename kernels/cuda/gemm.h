// The compute slices' matrix products through cuBLASLt: out = x · Wᵀ with x and W in bf16,
// float32 accumulation and output, and the bias or the residual add fused into the epilogue.
// A plan (descriptors and the chosen algorithm) is made once per shape and reused. Up to
// kSmallBatchRows rows go to SmallBatchGemm instead (small_batch_gemm.h), which streams the
// weights closer to the read rate than cuBLAS does there.
//
// Asking cuBLASLt for an algorithm may load kernels into the CUDA context (cuLibraryLoadData), and
// a load waits until the context's running kernels end. On a compute node whose device links have
// waits spinning on the GPU, that wait may never end on its own (two rotating compute nodes each
// sat in such a load, waiting for the other's hand-overs). Running an algorithm for the first time
// loads its kernels too. Prepare() therefore asks for every algorithm a node
// will need, and runs each once, before the node serves; a later shape reuses a prepared algorithm
// rather than ask again.
// Thread-compatible: one caller at a time per Gemm.
#ifndef LAMINA_KERNELS_CUDA_GEMM_H_
#define LAMINA_KERNELS_CUDA_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

struct cublasLtContext;

namespace lamina::kernels::cuda {

using bf16 = __nv_bfloat16;

// The part of a product's shape that does not change with the number of rows.
struct GemmShape {
  int64_t n = 0;
  int64_t k = 0;
  bool bias = false;
  bool accumulate = false;
  // The weights [n, k] the product will run with, for Prepare's trial runs; null: zeroed scratch.
  const bf16* weights = nullptr;
};

class Gemm {
 public:
  static absl::StatusOr<std::unique_ptr<Gemm>> Create();
  ~Gemm();

  // out[m, n] = (accumulate ? out : 0) + x[m, k] · w[n, k]ᵀ (+ bias[n]).
  absl::Status Run(const bf16* x, const bf16* w, const float* bias, float* out, int64_t m, int64_t n, int64_t k,
                   bool accumulate, cudaStream_t stream);

  // Run with x in float32, rounded to bf16 first: where SmallBatchGemm takes the product, in one
  // launch (SmallBatchGemmRoundingX); elsewhere ToBf16 writes the rounded x into `x_bf16` [m, k],
  // which Run then reads. The same bits either way.
  absl::Status RunRoundingX(const float* x, bf16* x_bf16, const bf16* w, const float* bias, float* out, int64_t m,
                            int64_t n, int64_t k, bool accumulate, cudaStream_t stream);

  // Plans each of `shapes` now for every power-of-two row count above kSmallBatchRows, up to
  // `max_rows` rounded up. Afterwards a Run of a prepared shape with another row count uses the
  // algorithm planned for the next larger one (the largest, past `max_rows`), once cuBLASLt has
  // checked that it supports the actual shape (cublasLtMatmulAlgoCheck); only where it does not is
  // cuBLASLt asked again. A power of two for which cuBLASLt has no algorithm is left out.
  // Then runs each distinct algorithm chosen once, at the fewest rows it supports, on zeroed inputs
  // (`weights`, or scratch), and waits for the runs: their kernels are loaded when this returns.
  // May be called again, for other shapes or other limits.
  absl::Status Prepare(const std::vector<GemmShape>& shapes, int64_t max_rows);

  // How many times cuBLASLt has been asked for an algorithm (Prepare's included).
  int64_t algorithm_queries() const { return algorithm_queries_; }
  // How many distinct algorithms Prepare has run.
  int64_t algorithms_run() const { return static_cast<int64_t>(algorithms_run_.size()); }

  // false: every shape through cuBLASLt (for benchmarks that compare the two).
  void set_use_small_batch(bool use) { use_small_batch_ = use; }

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool>;  // m, n, k, bias, accumulate
  using ShapeKey = std::tuple<int64_t, int64_t, bool, bool>;       // n, k, bias, accumulate
  Gemm() = default;
  absl::StatusOr<Plan*> PlanFor(const Key& key);
  // A plan's descriptors for `key`, with no algorithm yet.
  absl::StatusOr<std::unique_ptr<Plan>> Describe(const Key& key) const;
  // Sets plan->algo from cuBLASLt's heuristic.
  absl::Status AskForAlgorithm(const Key& key, Plan* plan);
  // Whether cuBLASLt runs `chosen`'s algorithm for `plan`'s shape within the workspace
  // (cublasLtMatmulAlgoCheck).
  bool Supports(const Plan& plan, const Plan& chosen) const;
  // Sets plan->algo to the prepared algorithm nearest above key's rows, if cuBLASLt supports it
  // for key's shape; false when there is none.
  bool ReusePrepared(const Key& key, Plan* plan) const;
  // Runs each prepared algorithm of `shape` not run before, once (Prepare).
  absl::Status RunPreparedOnce(const GemmShape& shape);
  // out = x · wᵀ with `plan`'s descriptors and `chosen`'s algorithm.
  absl::Status Multiply(const Plan& plan, const Plan& chosen, const bf16* x, const bf16* w, const float* bias,
                        float* out, bool accumulate, cudaStream_t stream);

  cublasLtContext* handle_ = nullptr;
  ::lamina::cuda::DeviceBuffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<ShapeKey, std::map<int64_t, const Plan*>> prepared_;  // by shape, then rows
  std::vector<std::vector<uint64_t>> algorithms_run_;                // bias, accumulate, then the algorithm
  bool use_small_batch_ = true;
  int64_t algorithm_queries_ = 0;
};

}  // namespace lamina::kernels::cuda

#endif  // LAMINA_KERNELS_CUDA_GEMM_H_
