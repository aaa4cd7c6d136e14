// One lane's attention on a compute node: each sequence lives either in the node's own KV pool
// (attended in this process, on its device) or on a memory node (reached through RemoteAttention),
// as the coordinator placed it. A step's calls are split by place; a step whose sequences are all
// local runs on the local pool alone (on a GPU as LocalDeviceDecode, the whole step one CUDA
// graph), one whose sequences are all remote goes as RemoteAttention sends it (device links
// included), and a step mixing both goes through host memory: each layer's remote rows leave
// first, and the local ones are attended while the memory nodes work on theirs.
// Thread-compatible: one step at a time (lanes each have their own; the pool is shared, locked).
#ifndef LAMINA_COMPUTE_NODE_LOCAL_PLACED_ATTENTION_H_
#define LAMINA_COMPUTE_NODE_LOCAL_PLACED_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/attention/attention_service.h"
#include "common/metrics/busy_meter.h"
#include "compute_node/local/local_pool.h"
#include "compute_node/remote/remote_attention.h"

namespace lamina {

class PlacedAttention : public AttentionService, public DeviceDecode, public LocalDeviceDecode {
 public:
  // `local`: the node's own pool, named `local_name` in the plans (null: none); `remote`: its
  // memory nodes (null: none). Both must outlive this; at least one is given. A sequence is local
  // unless Assign placed it on a memory node (with no local pool, every sequence is remote).
  static absl::StatusOr<std::unique_ptr<PlacedAttention>> Create(LocalPool* local, std::string local_name,
                                                                  RemoteAttention* remote);

  // Places `seq` on `node`: this node's own pool or one of the memory nodes. InvalidArgument for a
  // node that is neither.
  absl::Status Assign(SequenceId seq, const std::string& node);
  // Drops a finished sequence's placement (its slots are freed by the coordinator).
  void Forget(SequenceId seq);
  // Memory nodes that failed since the last call (RemoteAttention::TakeFailedNodes).
  std::vector<RemoteAttention::FailedNode> TakeFailedNodes();
  // Per-layer round trips to the memory nodes (none for local sequences).
  const BusyMeter& round_trips() const { return remote_ != nullptr ? remote_->round_trips() : no_round_trips_; }
  void set_compute_meter(BusyUnion* computing) {
    if (remote_ != nullptr) remote_->set_compute_meter(computing);
  }
  bool has_local_pool() const { return local_ != nullptr; }

  // AttentionService.
  absl::Status Reserve(absl::Span<const Reservation> reservations) override;
  absl::Status StoreKv(int64_t layer, SequenceId seq, int32_t first_position, int64_t count, const float* k,
                       const float* v, int64_t row_stride) override;
  absl::Status FlushStores() override;
  absl::Status Decode(int64_t layer, absl::Span<const DecodeEntry> entries, const float* qkv, const QkvLayout& layout,
                      float* out, int64_t out_stride) override;
  void Free(SequenceId seq) override;
  DeviceDecode* device_decode() override;
  LocalDeviceDecode* local_device_decode() override { return step_ != nullptr ? this : nullptr; }
  bool has_own_pool() const override { return local_ != nullptr; }

  // DeviceDecode: the memory nodes' device links, for steps with no local sequence.
  bool CanDecodeOnDevice(absl::Span<const DecodeEntry> entries, const QkvLayout& layout) override;
  absl::Status BeginDeviceDecode(absl::Span<const DecodeEntry> entries, absl::Span<const int64_t> layers) override;
  absl::Status QueueDeviceDecode(int64_t layer, const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                                 CUstream_st* stream) override;
  absl::Status EndDeviceDecode() override;
  void AbandonDeviceStep() override;
  bool CanStoreOnDevice(absl::Span<const PromptRows> prompts) override;
  absl::Status BeginDeviceStore(absl::Span<const PromptRows> prompts, absl::Span<const int64_t> layers) override;
  absl::Status QueueDeviceStore(int64_t layer, const float* qkv, int64_t qkv_stride, CUstream_st* stream) override;
  absl::Status EndDeviceStore() override;

  // LocalDeviceDecode: the local pool on this node's GPU.
  bool Holds(absl::Span<const DecodeEntry> entries) override;
  bool HoldsPrompts(absl::Span<const PromptRows> prompts) override;
  absl::StatusOr<uint64_t> BeginStep(absl::Span<const DecodeEntry> entries, int64_t padded_rows,
                                     CUstream_st* stream) override;
  absl::Status QueueLayer(int64_t layer, const float* qkv, const QkvLayout& layout, float* out, int64_t out_stride,
                          CUstream_st* stream) override;
  absl::Status BeginStore(absl::Span<const PromptRows> prompts, CUstream_st* stream) override;
  absl::Status QueueStore(int64_t layer, const float* qkv, const QkvLayout& layout, CUstream_st* stream) override;

 private:
  PlacedAttention(LocalPool* local, std::string local_name, RemoteAttention* remote)
      : local_(local), local_name_(std::move(local_name)), remote_(remote) {}
  bool IsLocal(SequenceId seq) const { return local_ != nullptr && !remote_seqs_.contains(seq); }
  // The local pool's index of the model's layer `layer` (a layer split's node holds only its own).
  int64_t Local(int64_t layer) const { return layer - local_->first_layer(); }
  // One side's rows of a mixed step: their entries, q/k/v and outputs, gathered apart.
  struct Part {
    std::vector<DecodeEntry> entries;
    std::vector<float> qkv, out;
  };
  static void Gather(absl::Span<const DecodeEntry> entries, const std::vector<size_t>& rows, const float* qkv,
                     const QkvLayout& layout, Part* part);
  static void Scatter(const Part& part, const std::vector<size_t>& rows, float* out, int64_t out_stride);

  LocalPool* local_;
  std::string local_name_;
  RemoteAttention* remote_;
  std::unique_ptr<LocalKvStep> step_;  // on a GPU pool: this lane's tables
  absl::flat_hash_set<SequenceId> remote_seqs_;
  BusyMeter no_round_trips_;
  // A mixed step's scratch: which rows are on each side, and each side's part.
  std::vector<size_t> local_rows_, remote_rows_;
  Part local_part_, remote_part_;
};

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_LOCAL_PLACED_ATTENTION_H_
