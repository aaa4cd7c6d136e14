// A caller's local steps on a CUDA KV pool's GPU (LocalKvStep, kv_backend.h).
#include <algorithm>
#include <memory>

#include "kv/attention/cuda_kv_pool.h"

namespace lamina {
namespace cuda_kv {
namespace {

// The smallest power of two at least `context`: a local step plans its attention for that longest
// context, so that a plan (and the graphs holding it) lasts while contexts grow. Any plan serves
// shorter contexts: its splits cut each sequence's own context.
int64_t PlannedContext(int64_t context) {
  int64_t planned = 1;
  while (planned < context) planned *= 2;
  return planned;
}

// A caller's local steps on the pool's GPU: the tables live in device buffers that only grow (each
// growth a new generation, which graph_key() tells), uploaded from pinned staging on the caller's
// stream.
class CudaLocalStep : public LocalKvStep {
 public:
  static absl::StatusOr<std::unique_ptr<CudaLocalStep>> Create(const CudaKvBackend* pool) {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool->device()));
    std::unique_ptr<CudaLocalStep> step(new CudaLocalStep(pool));
    LAMINA_ASSIGN_OR_RETURN(step->pool_writes_, cuda::Event::CreateForOrdering());
    LAMINA_ASSIGN_OR_RETURN(step->uploaded_, cuda::Event::CreateForOrdering());
    LAMINA_ASSIGN_OR_RETURN(step->fence_, cuda::DeviceBuffer::CreateZeroed(sizeof(uint32_t)));
    return step;
  }

  absl::Status SetStep(absl::Span<const int32_t> write_slots, absl::Span<const int32_t> slot_ids,
                       absl::Span<const int64_t> slot_begin, int64_t padded_rows, bool repeats,
                       CUstream_st* stream) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->device()));
    const int64_t n = static_cast<int64_t>(write_slots.size());
    const int64_t padded = std::max<int64_t>(padded_rows, n);
    if (padded == 0) return absl::InvalidArgumentError("a local step of no rows");
    const int64_t ids = static_cast<int64_t>(slot_ids.size()) + (padded - n);
    // [write slots: padded][slot begins: padded + 1][slot ids: ids]
    const int64_t entries = 2 * padded + 1 + ids;
    LAMINA_RETURN_IF_ERROR(StagingFree());
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_, entries * sizeof(int32_t), &retired_));
    LAMINA_RETURN_IF_ERROR(Grow(&tables_, entries * sizeof(int32_t)));
    int32_t* h = host_.as<int32_t>();
    const int32_t scratch = pool_->scratch_slot();
    int32_t* begin = h + padded;
    int32_t* id = begin + padded + 1;
    int64_t max_context = 1;
    for (int64_t s = 0; s < padded; ++s) h[s] = s < n ? write_slots[s] : scratch;
    std::copy(slot_ids.begin(), slot_ids.end(), id);
    for (int64_t s = 0; s <= n; ++s) {
      begin[s] = static_cast<int32_t>(slot_begin[s]);
      if (s > 0) max_context = std::max(max_context, slot_begin[s] - slot_begin[s - 1]);
    }
    for (int64_t s = n; s < padded; ++s) {  // a padding row attends to the scratch slot alone
      id[begin[s]] = scratch;
      begin[s + 1] = begin[s] + 1;
    }
    plan_ = pool_->Plan(padded, PlannedContext(max_context), pool_->num_sms());
    LAMINA_RETURN_IF_ERROR(Grow(&workspace_, std::max<int64_t>(1, plan_.workspace_floats) * sizeof(float)));
    // After the pool's host-path writes (prompts stored through host memory) that the step reads.
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventRecord(pool_writes_.get(), pool_->host_path_stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, pool_writes_.get(), 0));
    LAMINA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(tables_.data(), h, entries * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_.get(), stream));
    write_slots_ = tables_.as<int32_t>();
    slot_begin_ = write_slots_ + padded;
    slot_ids_ = slot_begin_ + padded + 1;
    rows_ = padded;
    repeats_ = repeats;
    return absl::OkStatus();
  }

  uint64_t graph_key() const override {
    // Everything a captured layer bakes in: the tables' and workspace's generation, the rows, the
    // plan and whether stores are fenced from the attention.
    uint64_t key = generation_;
    for (const int64_t part : {rows_, int64_t{plan_.splits}, static_cast<int64_t>(plan_.strategy),
                               int64_t{plan_.pairs_per_block}, int64_t{repeats_}}) {
      key = key * 1000003u + static_cast<uint64_t>(part);
    }
    return key;
  }

  absl::Status QueueLayer(int64_t layer, const float* qkv, const QkvLayout& layout, float* out, int64_t out_stride,
                          CUstream_st* stream) override {
    if (rows_ == 0) return absl::FailedPreconditionError("a local step's layer queued before its SetStep");
    LAMINA_RETURN_IF_ERROR(pool_->StoreRows(layer, qkv + layout.k_offset, qkv + layout.v_offset, layout.row_stride,
                                            write_slots_, rows_, stream));
    if (repeats_) {
      // Work that is not a chained kernel: the attention below may not start before the stores
      // are done (kernels/cuda/attention.h: a tiled plan reads all but each context's last token
      // early).
      LAMINA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(fence_.data(), 0, sizeof(uint32_t), stream));
    }
    return pool_->Decode(layer, plan_, qkv + layout.q_offset, layout.row_stride, slot_ids_, slot_begin_, out,
                         out_stride, rows_, workspace_.as<float>(), stream);
  }

  absl::Status SetStoreSlots(absl::Span<const int32_t> slots, CUstream_st* stream) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->device()));
    store_count_ = static_cast<int64_t>(slots.size());
    if (store_count_ == 0) return absl::OkStatus();
    LAMINA_RETURN_IF_ERROR(StagingFree());
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_, slots.size() * sizeof(int32_t), &retired_));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacity(&store_slots_, slots.size() * sizeof(int32_t)));
    std::copy(slots.begin(), slots.end(), host_.as<int32_t>());
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventRecord(pool_writes_.get(), pool_->host_path_stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, pool_writes_.get(), 0));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(store_slots_.data(), host_.data(), slots.size() * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_.get(), stream));
    return absl::OkStatus();
  }

  absl::Status QueueStore(int64_t layer, const float* qkv, const QkvLayout& layout, CUstream_st* stream) override {
    if (store_count_ == 0) return absl::OkStatus();
    return pool_->StoreRows(layer, qkv + layout.k_offset, qkv + layout.v_offset, layout.row_stride,
                            store_slots_.as<int32_t>(), store_count_, stream);
  }

 private:
  explicit CudaLocalStep(const CudaKvBackend* pool) : pool_(pool) {}

  // The last upload from the pinned staging has been read.
  absl::Status StagingFree() {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploaded_.get()));
    return absl::OkStatus();
  }
  // Grows a buffer that captured graphs point into: a new generation when it moves. Not ordered on
  // the caller's stream, which may be gone before this step (its buffers) is.
  absl::Status Grow(cuda::DeviceBuffer* buffer, size_t bytes) {
    if (buffer->bytes() >= bytes) return absl::OkStatus();
    ++generation_;
    return cuda::EnsureCapacity(buffer, std::max(bytes, 2 * buffer->bytes()));
  }

  const CudaKvBackend* pool_;
  cuda::Event pool_writes_;  // the pool's host-path writes so far
  cuda::Event uploaded_;     // the latest upload from host_
  cuda::PinnedBuffer host_;  // int32 staging of the tables or store slots
  std::vector<cuda::PinnedBuffer> retired_;
  cuda::DeviceBuffer tables_;       // int32 [write slots][slot begins][slot ids]
  cuda::DeviceBuffer workspace_;    // float [plan_.workspace_floats]
  cuda::DeviceBuffer store_slots_;  // int32 [store_count_]
  cuda::DeviceBuffer fence_;        // a word that repeats_ steps clear between stores and attention
  uint64_t generation_ = 0;
  int32_t* write_slots_ = nullptr;
  int32_t* slot_begin_ = nullptr;
  int32_t* slot_ids_ = nullptr;
  int64_t rows_ = 0;
  bool repeats_ = false;
  kc::DecodePlan plan_;
  int64_t store_count_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LocalKvStep>> NewCudaLocalStep(const CudaKvBackend* pool) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaLocalStep> step, CudaLocalStep::Create(pool));
  return step;
}

}  // namespace cuda_kv
}  // namespace lamina
