#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/small_batch_gemm.h"

namespace lamina::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32 << 20;

absl::Status LtStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasLtGetStatusName(status), " (",
                                          cublasLtGetStatusString(status), ")"));
}

#define LAMINA_LT_RETURN_IF_ERROR(expr) LAMINA_RETURN_IF_ERROR(LtStatus((expr), #expr))

}  // namespace

// Row-major out[m, n] is column-major outᵀ [n, m]; outᵀ = W · xᵀ with W (row-major [n, k]) read as
// column-major [k, n] and transposed: the "TN" product cuBLAS is fastest at.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool reused = false;  // algo was prepared for another row count
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create() {
  std::unique_ptr<Gemm> gemm(new Gemm());
  LAMINA_LT_RETURN_IF_ERROR(cublasLtCreate(&gemm->handle_));
  LAMINA_ASSIGN_OR_RETURN(gemm->workspace_, ::lamina::cuda::DeviceBuffer::Create(kWorkspaceBytes));
  return gemm;
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

absl::StatusOr<std::unique_ptr<Gemm::Plan>> Gemm::Describe(const Key& key) const {
  const auto [m, n, k, bias, accumulate] = key;
  auto plan = std::make_unique<Plan>();
  LAMINA_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t none = CUBLAS_OP_N;
  LAMINA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                           sizeof(transpose)));
  LAMINA_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
  if (bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_32F;
    LAMINA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                             sizeof(epilogue)));
    LAMINA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                             &bias_type, sizeof(bias_type)));
  }
  LAMINA_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k));
  LAMINA_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, k));
  LAMINA_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, n, m, n));
  return plan;
}

absl::Status Gemm::AskForAlgorithm(const Key& key, Plan* plan) {
  ++algorithm_queries_;
  cublasLtMatmulPreference_t preference = nullptr;
  LAMINA_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace = workspace_.bytes();
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                       sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c,
                                                               plan->c, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  LAMINA_RETURN_IF_ERROR(LtStatus(status, "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) {
    const auto [m, n, k, bias, accumulate] = key;
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for a bf16 GEMM of m=", m, " n=", n,
                                                 " k=", k));
  }
  plan->algo = result.algo;
  return absl::OkStatus();
}

bool Gemm::Supports(const Plan& plan, const Plan& chosen) const {
  cublasLtMatmulHeuristicResult_t check;
  return cublasLtMatmulAlgoCheck(handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, &chosen.algo, &check) ==
             CUBLAS_STATUS_SUCCESS &&
         check.workspaceSize <= workspace_.bytes();
}

bool Gemm::ReusePrepared(const Key& key, Plan* plan) const {
  const auto [m, n, k, bias, accumulate] = key;
  auto shape = prepared_.find(ShapeKey{n, k, bias, accumulate});
  if (shape == prepared_.end() || shape->second.empty()) return false;
  auto above = shape->second.lower_bound(m);
  const Plan* prepared = above != shape->second.end() ? above->second : shape->second.rbegin()->second;
  if (!Supports(*plan, *prepared)) return false;
  plan->algo = prepared->algo;
  plan->reused = true;
  return true;
}

absl::StatusOr<Gemm::Plan*> Gemm::PlanFor(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, Describe(key));
  if (!ReusePrepared(key, plan.get())) LAMINA_RETURN_IF_ERROR(AskForAlgorithm(key, plan.get()));
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status Gemm::Prepare(const std::vector<GemmShape>& shapes, int64_t max_rows) {
  for (const GemmShape& s : shapes) {
    std::map<int64_t, const Plan*>& rows = prepared_[ShapeKey{s.n, s.k, s.bias, s.accumulate}];
    for (int64_t m = 2 * kSmallBatchRows; m < 2 * max_rows; m *= 2) {
      const Key key{m, s.n, s.k, s.bias, s.accumulate};
      auto it = plans_.find(key);
      if (it == plans_.end()) {
        LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, Describe(key));
        // No algorithm at this size: the other sizes serve it, or a Run asks again.
        if (!AskForAlgorithm(key, plan.get()).ok()) continue;
        it = plans_.emplace(key, std::move(plan)).first;
      }
      rows[m] = it->second.get();
    }
  }
  for (const GemmShape& s : shapes) LAMINA_RETURN_IF_ERROR(RunPreparedOnce(s));
  return absl::OkStatus();
}

absl::Status Gemm::RunPreparedOnce(const GemmShape& s) {
  const std::map<int64_t, const Plan*>& rows = prepared_[ShapeKey{s.n, s.k, s.bias, s.accumulate}];
  ::lamina::cuda::DeviceBuffer scratch_w, bias;
  LAMINA_ASSIGN_OR_RETURN(::lamina::cuda::Stream stream, ::lamina::cuda::Stream::Create());
  for (const auto& [own_rows, plan] : rows) {
    std::vector<uint64_t> id = {s.bias, s.accumulate};
    id.insert(id.end(), std::begin(plan->algo.data), std::end(plan->algo.data));
    if (std::find(algorithms_run_.begin(), algorithms_run_.end(), id) != algorithms_run_.end()) continue;
    // At the fewest prepared rows the algorithm supports (rows ascend, and its own rows support it).
    int64_t m = own_rows;
    const Plan* at = plan;
    for (const auto& [fewer, candidate] : rows) {
      if (Supports(*candidate, *plan)) {
        m = fewer;
        at = candidate;
        break;
      }
    }
    const bf16* w = s.weights;
    if (w == nullptr) {
      if (scratch_w.bytes() == 0) {
        LAMINA_ASSIGN_OR_RETURN(scratch_w, ::lamina::cuda::DeviceBuffer::Create(s.n * s.k * sizeof(bf16)));
        LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch_w.data(), 0, scratch_w.bytes(), stream.get()));
      }
      w = scratch_w.as<bf16>();
    }
    if (s.bias && bias.bytes() == 0) {
      LAMINA_ASSIGN_OR_RETURN(bias, ::lamina::cuda::DeviceBuffer::Create(s.n * sizeof(float)));
      LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bias.data(), 0, bias.bytes(), stream.get()));
    }
    LAMINA_ASSIGN_OR_RETURN(auto x, ::lamina::cuda::DeviceBuffer::Create(m * s.k * sizeof(bf16)));
    LAMINA_ASSIGN_OR_RETURN(auto out, ::lamina::cuda::DeviceBuffer::Create(m * s.n * sizeof(float)));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x.data(), 0, x.bytes(), stream.get()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out.data(), 0, out.bytes(), stream.get()));
    LAMINA_RETURN_IF_ERROR(Multiply(*at, *plan, x.as<bf16>(), w, bias.as<float>(), out.as<float>(),
                                    s.accumulate, stream.get()));
    LAMINA_RETURN_IF_ERROR(stream.Synchronize());
    algorithms_run_.push_back(std::move(id));
  }
  return absl::OkStatus();
}

absl::Status Gemm::Multiply(const Plan& plan, const Plan& chosen, const bf16* x, const bf16* w, const float* bias,
                            float* out, bool accumulate, cudaStream_t stream) {
  if (bias) {
    LAMINA_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = 1.f;
  const float beta = accumulate ? 1.f : 0.f;
  return LtStatus(cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, out, plan.c, out, plan.c,
                                 &chosen.algo, workspace_.data(), workspace_.bytes(), stream),
                  "cublasLtMatmul");
}

absl::Status Gemm::RunRoundingX(const float* x, bf16* x_bf16, const bf16* w, const float* bias, float* out,
                                int64_t m, int64_t n, int64_t k, bool accumulate, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  if (use_small_batch_ && SmallBatchGemmApplies(x, w, m, k)) {
    return SmallBatchGemmRoundingX(x, w, bias, out, m, n, k, accumulate, stream);
  }
  LAMINA_RETURN_IF_ERROR(ToBf16(x, x_bf16, m * k, stream));
  return Run(x_bf16, w, bias, out, m, n, k, accumulate, stream);
}

absl::Status Gemm::Run(const bf16* x, const bf16* w, const float* bias, float* out, int64_t m, int64_t n, int64_t k,
                       bool accumulate, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  if (use_small_batch_ && SmallBatchGemmApplies(x, w, m, k)) {
    return SmallBatchGemm(x, w, bias, out, m, n, k, accumulate, stream);
  }
  const Key key{m, n, k, bias != nullptr, accumulate};
  LAMINA_ASSIGN_OR_RETURN(Plan * plan, PlanFor(key));
  absl::Status status = Multiply(*plan, *plan, x, w, bias, out, accumulate, stream);
  if (!status.ok() && plan->reused) {
    // cuBLASLt passed the reused algorithm but refused to run it: ask for one of this shape's own.
    plan->reused = false;
    LAMINA_RETURN_IF_ERROR(AskForAlgorithm(key, plan));
    status = Multiply(*plan, *plan, x, w, bias, out, accumulate, stream);
  }
  return status;
}

}  // namespace lamina::kernels::cuda
