// The CUDA KV backend's device lanes (DeviceKvLane: decode steps whose rows arrive over device
// links) and its factory; the pool itself is cuda_kv_pool.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/queue_pacer.h"
#include "common/status/status_macros.h"
#include "data_plane/device_link.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/data_plane.h"
#include "kernels/cuda/packets.h"
#include "kv/attention/cuda_kv_pool.h"
#include "kv/attention/kv_backend.h"
#include "kv/attention/spin_budget.h"

namespace lamina {
namespace cuda_kv {
namespace {

// The largest linked attention launch that waits for its rows in every block (QueueLinkedChunk):
// on a flag, and polling lines or packets, where each block reads its own. Many spinning blocks
// slow the round trip (their figures: the data plane's section of tests/bench/RESULTS.md and this
// file's history), so they stay within one wave of the GPU, counted as the spin budget counts them
// (spin_budget.h; a lone lane's small blocks by the SMs they fill). The lanes of a GPU share that
// budget: a launch past it waits behind a kernel of a few blocks instead.
constexpr int64_t kMostWaitingBlocks = 16;
constexpr int64_t kMostPollingBlocks = 128;

// Where a chunk's q/k/v come as packets, its launch polls them itself where the planner picks a
// warp per (sequence, kv head) (short contexts, many pairs: each warp polls its own rows, attends
// and sends its outputs), or else where its blocks (a block per (sequence, kv head)) take at most
// kMostPacketPollingWaves waves of the chunk's share of the GPU, or the step's contexts reach
// kLongPacketContext tokens: each block then attends as soon as its own rows are in while the rest
// travel, having started its first tiles before it polls, and sends its outputs itself. Past
// that, short contexts' many waves of blocks that each poll and have little to attend to cost
// more than the planner's launch behind a ReceivePackets queued ahead that puts the rows in place
// (where each was measured faster: kc::PlanPolledDecode, and this file's history).
constexpr int64_t kMostPacketPollingWaves = 2;
constexpr int64_t kLongPacketContext = 256;

// The most units of a step (a layer's chunk, or a layer's transfer of a store: each a few launches
// and two timing events, which take a launch's room too, 8 at most) a lane queues ahead of its
// GPU: 512 of the 1021 a stream holds (common/cuda/queue_pacer.h). A step of 32 layers in 4
// chunks is 128 units.
constexpr int kMostQueuedUnits = 64;

// One lane of device-side decode steps: its own stream, slot lists, plans and outputs.
class CudaKvLane : public DeviceKvLane {
 public:
  static absl::StatusOr<std::unique_ptr<CudaKvLane>> Create(const CudaKvBackend* pool, int max_chunks) {
    if (max_chunks < 1) return absl::InvalidArgumentError(absl::StrCat("a lane of ", max_chunks, " chunks a step"));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool->device()));
    std::unique_ptr<CudaKvLane> lane(new CudaKvLane(pool));
    lane->budget_lane_ = pool->spin_budget()->AddLane();
    LAMINA_ASSIGN_OR_RETURN(lane->stream_, cuda::Stream::Create());
    // Not mid-run: a stream made then may wait for every spinning wait on the GPU (kv_backend.h).
    for (int c = 0; max_chunks > 1 && c < max_chunks; ++c) {
      LAMINA_ASSIGN_OR_RETURN(cuda::Stream s, cuda::Stream::Create());
      lane->chunk_streams_.push_back(std::move(s));
    }
    LAMINA_ASSIGN_OR_RETURN(lane->pool_writes_, cuda::Event::Create());
    LAMINA_ASSIGN_OR_RETURN(lane->step_ready_, cuda::Event::Create());
    LAMINA_ASSIGN_OR_RETURN(lane->pacer_, cuda::QueuePacer::Create(kMostQueuedUnits));
    LAMINA_ASSIGN_OR_RETURN(lane->busy_ns_, cuda::DeviceBuffer::Create(2 * sizeof(uint64_t)));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(lane->busy_ns_.data(), 0, 2 * sizeof(uint64_t)));
    return lane;
  }

  ~CudaKvLane() override {
    GiveBackSpinning();
    pool_->spin_budget()->RemoveLane(budget_lane_);
  }

  CUstream_st* stream() const override { return stream_.get(); }
  const float* step_out() const override { return out_.as<float>(); }
  // Once the step has ended, nothing of it spins: its share of the budget goes back.
  absl::Status Synchronize() override {
    for (const cuda::Stream& s : chunk_streams_) LAMINA_RETURN_IF_ERROR(s.Synchronize());
    LAMINA_RETURN_IF_ERROR(stream_.Synchronize());
    GiveBackSpinning();
    return absl::OkStatus();
  }

  absl::StatusOr<absl::Duration> TakeBusy() override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->device()));
    uint64_t linked_ns = 0;
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&linked_ns, busy_ns_.data(), sizeof(linked_ns), cudaMemcpyDeviceToHost));
    if (linked_ns != 0) LAMINA_CUDA_RETURN_IF_ERROR(cudaMemset(busy_ns_.data(), 0, sizeof(uint64_t)));
    absl::Duration busy = absl::Nanoseconds(linked_ns);
    for (int i = 0; i < timed_chunks_; ++i) {
      LAMINA_ASSIGN_OR_RETURN(const float ms, chunk_events_[i].second.ElapsedSince(chunk_events_[i].first));
      busy += absl::Microseconds(ms * 1e3);
    }
    timed_chunks_ = 0;
    return busy;
  }

  absl::Status SetStep(absl::Span<const int32_t> write_slots, absl::Span<const int32_t> slot_ids,
                       absl::Span<const int64_t> slot_begin, int chunks) override {
    if (chunks > max_chunks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a step in ", chunks, " chunks on a lane of at most ", max_chunks()));
    }
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->device()));
    LAMINA_RETURN_IF_ERROR(Synchronize());  // the staging below may still feed the last step
    step_share_ = pool_->spin_budget()->BeginStep(budget_lane_);
    const KvBackendOptions& o = pool_->options();
    const int64_t n = static_cast<int64_t>(write_slots.size());
    const int64_t q_size = o.attention.num_q_heads * o.attention.head_dim;
    const int64_t staged = n + static_cast<int64_t>(slot_ids.size()) + n + 1;
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_, staged * sizeof(int32_t), &retired_));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&lists_, staged * sizeof(int32_t), stream_.get()));
    LAMINA_RETURN_IF_ERROR(
        cuda::EnsureCapacityOnStream(&out_, std::max<int64_t>(1, n) * q_size * sizeof(float), stream_.get()));
    // [write slots][slot ids][slot begins], one upload.
    int32_t* h = host_.as<int32_t>();
    std::copy(write_slots.begin(), write_slots.end(), h);
    std::copy(slot_ids.begin(), slot_ids.end(), h + n);
    int64_t max_context = 0;
    for (int64_t i = 0; i <= n; ++i) {
      h[n + slot_ids.size() + i] = static_cast<int32_t>(slot_begin[i]);
      if (i > 0) max_context = std::max(max_context, slot_begin[i] - slot_begin[i - 1]);
    }
    write_slots_ = lists_.as<int32_t>();
    slot_ids_ = write_slots_ + n;
    slot_begin_ = slot_ids_ + slot_ids.size();
    // After the pool's host-path writes (a prompt's k/v) that this step reads.
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventRecord(pool_writes_.get(), pool_->host_path_stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), pool_writes_.get(), 0));
    LAMINA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(lists_.data(), host_.data(), staged * sizeof(int32_t), cudaMemcpyHostToDevice, stream_.get()));
    // Each chunk's plans, workspace and counters; nothing may allocate once the step's waits are
    // queued (cudaFree would wait for them). Linked chunks run side by side, each on a stream of
    // its own so that its attention starts as soon as its rows arrive: each is planned for its
    // share of the GPU (so that together they split the contexts as one launch of the step would)
    // and has a workspace of its own. Unlinked chunks run one after another on the lane's stream,
    // each with the whole GPU, in one workspace.
    plans_.clear();
    side_by_side_plans_.clear();
    workspace_floats_ = 1;
    int64_t one_after_another_floats = 1;
    const int share = std::max(1, pool_->num_sms() / chunks);
    for (int c = 0; c < chunks; ++c) {
      const RowRange r = ChunkOf(n, chunks, c);
      plans_.push_back(pool_->Plan(r.count, max_context, pool_->num_sms()));
      side_by_side_plans_.push_back(pool_->Plan(r.count, max_context, share));
      one_after_another_floats = std::max(one_after_another_floats, plans_.back().workspace_floats);
      workspace_floats_ = std::max(workspace_floats_, side_by_side_plans_.back().workspace_floats);
    }
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(
        &workspace_, std::max(chunks * workspace_floats_, one_after_another_floats) * sizeof(float), stream_.get()));
    // The linked launches' counters, for the largest chunk, per chunk; each launch leaves them zeroed.
    chunk_counters_ = kc::LinkedDecodeCounters(o.attention, ChunkOf(n, chunks, 0).count);
    LAMINA_RETURN_IF_ERROR(
        cuda::EnsureCapacityOnStream(&counters_, chunks * chunk_counters_ * sizeof(uint32_t), stream_.get()));
    LAMINA_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(counters_.data(), 0, chunks * chunk_counters_ * sizeof(uint32_t), stream_.get()));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&busy_starts_, chunks * sizeof(uint64_t), stream_.get()));
    LAMINA_RETURN_IF_ERROR(ForkChunkStreams(chunks));
    waits_.assign(chunks, std::nullopt);
    pairs_per_block_.assign(chunks, 1);
    rows_ = n;
    max_context_ = max_context;
    return absl::OkStatus();
  }

  absl::Status SetStoreSlots(absl::Span<const int32_t> slots) override {
    LAMINA_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->device()));
    LAMINA_RETURN_IF_ERROR(Synchronize());  // the staging below may still feed the last step
    step_share_ = pool_->spin_budget()->BeginStep(budget_lane_);
    const size_t bytes = std::max<size_t>(1, slots.size()) * sizeof(int32_t);
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityKeepingOld(&host_, bytes, &retired_));
    LAMINA_RETURN_IF_ERROR(cuda::EnsureCapacityOnStream(&lists_, bytes, stream_.get()));
    std::copy(slots.begin(), slots.end(), host_.as<int32_t>());
    write_slots_ = lists_.as<int32_t>();
    LAMINA_CUDA_RETURN_IF_ERROR(cudaEventRecord(pool_writes_.get(), pool_->host_path_stream()));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), pool_writes_.get(), 0));
    LAMINA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(lists_.data(), host_.data(), slots.size() * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream_.get()));
    return absl::OkStatus();
  }

  absl::Status QueueStore(int64_t layer, int64_t first_slot, int64_t count, const float* qkv,
                          const QkvLayout& layout) override {
    LAMINA_RETURN_IF_ERROR(Timed([&] {
      return pool_->StoreRows(layer, qkv + layout.k_offset, qkv + layout.v_offset, layout.row_stride,
                              write_slots_ + first_slot, count, stream_.get());
    }));
    return pacer_.Paced(stream_.get());
  }

  absl::Status QueueChunk(int64_t layer, int chunk, const float* qkv, const QkvLayout& layout) override {
    const int chunks = static_cast<int>(plans_.size());
    if (chunk < 0 || chunk >= chunks) return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " of ", chunks));
    const RowRange r = ChunkOf(rows_, chunks, chunk);
    if (r.count == 0) return absl::OkStatus();
    const float* rows = qkv + r.first * layout.row_stride;
    LAMINA_RETURN_IF_ERROR(Timed([&] { return QueueAttention(layer, chunk, r, rows, layout); }));
    return pacer_.Paced(stream_.get());
  }

  absl::Status QueueLinkedChunk(int64_t layer, int chunk, const float* qkv, const QkvLayout& layout,
                                const DeviceHop& hop) override {
    const int chunks = static_cast<int>(plans_.size());
    if (chunk < 0 || chunk >= chunks) return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " of ", chunks));
    const RowRange r = ChunkOf(rows_, chunks, chunk);
    const KvBackendOptions& o = pool_->options();
    const float* rows = qkv + r.first * layout.row_stride;
    const auto* flag_in = std::get_if<DeviceHop::FlagIn>(&hop.in);
    const auto* lines_in = std::get_if<DeviceHop::LinesIn>(&hop.in);
    const auto* packets_in = std::get_if<DeviceHop::PacketsIn>(&hop.in);
    const auto* rows_out = std::get_if<DeviceHop::RowsOut>(&hop.out);
    const auto* lines_out = std::get_if<DeviceHop::LinesOut>(&hop.out);
    const auto* packets_out = std::get_if<DeviceHop::PacketsOut>(&hop.out);
    if ((packets_in != nullptr) != (packets_out != nullptr)) {
      return absl::InvalidArgumentError("a hop's packets go both ways: in and out");
    }
    kc::DecodeLink link;
    link.timeout_ns = hop.timeout_ns;
    link.error = hop.error;
    link.error_code = hop.error_code;
    link.line_tag = hop.tag;
    link.k = rows + layout.k_offset;
    link.v = rows + layout.v_offset;
    link.kv_stride = layout.row_stride;
    link.write_slots = write_slots_ + r.first;
    link.counters = counters_.as<uint32_t>() + chunk * chunk_counters_;
    link.busy_ns = busy_ns_.as<uint64_t>();
    link.busy_start = busy_starts_.as<uint64_t>() + chunk;
    if (flag_in != nullptr) {
      link.ready = flag_in->ready;
      link.ready_value = flag_in->ready_value;
    }
    float* out = nullptr;
    int64_t out_stride = 0;
    if (rows_out != nullptr) {
      link.done = rows_out->done;
      link.done_value = rows_out->done_value;
      out = rows_out->out;
      out_stride = rows_out->stride;
    } else if (lines_out != nullptr) {
      link.out_lines = lines_out->lines;
      out = lines_out->mirror;
      out_stride = lines_out->stride;
    }
    cudaStream_t stream = ChunkStream(chunk);
    // Every block of a linked launch spins until the rows arrive. A few spinning blocks cost
    // nothing, but many make the round trip slower (kMostWaitingBlocks). Larger grids, and grids
    // past the lanes' budget, wait behind a small kernel queued ahead instead.
    kc::DecodePlan plan = side_by_side_plans_[chunk];
    // Lines are polled and written a block per (sequence, kv head): a chunk planned a warp per head
    // or query head (short contexts for its pairs) runs the tiled blocks the planner would pick
    // otherwise, in one split, with shallow tiles (a warp each is planned only past 2 pairs an SM).
    if ((lines_in != nullptr || lines_out != nullptr) && plan.by_warps()) {
      plan.strategy = kc::DecodeStrategy::kTiled;
    }
    bool send_packets = false;  // the outputs go as packets from the lane's rows, after the launch
    if (packets_in != nullptr) {
      // Packets: polled by the launch's warps or blocks (from the start where the launch fits the
      // spin budget, a lone lane's warp plans counted by the SMs their blocks fill, a warp per
      // query head in as few pairs a block as fit, else once one warp queued ahead has seen the
      // first packet) or ahead of the launch (the rule above kMostPacketPollingWaves says which).
      // A warp or block per (sequence, kv head) sends its outputs as packets where the link's rows
      // travel in a part a kv head; else they go into the lane's rows, and from there as packets.
      // The chunk's share of the GPU (SetStep plans chunks side by side so).
      const int share = std::max(1, pool_->num_sms() / chunks);
      plan = pool_->PolledPlan(plan, r.count, max_context_, share);
      // Where the compute end shares the GPU, its kernels need the SMs that larger blocks would
      // hold; else several lanes' budget, counting each block as an SM, may fit fewer of them.
      if (plan.strategy == kc::DecodeStrategy::kWarpPerQueryHead && !packets_in->sender_on_this_gpu) {
        plan.pairs_per_block = PairsPerBlock(chunk, plan, r.count);
      }
      const int64_t blocks = kc::DecodeBlocks(o.attention, plan, r.count);
      const int64_t wave = share * int64_t{kc::DecodeBlocksPerSm(o.attention)};  // a wave of that share
      if (plan.by_warps() || blocks <= kMostPacketPollingWaves * wave || max_context_ >= kLongPacketContext) {
        // Small blocks count by the SMs they fill, unless the sender needs this GPU's SMs too.
        const int64_t blocks_an_sm = packets_in->sender_on_this_gpu ? 1 : kc::PolledBlocksPerSm(o.attention, plan);
        const ChunkWait& wait =
            WaitOf(chunk, /*waits=*/true, /*lines=*/false, r.count, blocks, kMostPollingBlocks, blocks_an_sm);
        link.packets = packets_in->packets;
        link.packets_mirror = packets_in->mirror;
        if (!wait.in_launch) {
          LAMINA_RETURN_IF_ERROR(
              kc::WaitForFirstPacket(packets_in->packets, hop.tag, hop.timeout_ns, hop.error, hop.error_code, stream));
        }
        link.chained_to_wait = !wait.in_launch;
      } else {
        const ChunkWait& wait = PacketsWaitOf(chunk, kc::ReceivePacketsBlocks(r.count, layout.row_stride));
        LAMINA_RETURN_IF_ERROR(kc::ReceivePackets(
            {packets_in->packets, kc::PacketsPerRow(layout.row_stride), hop.tag, r.count, layout.row_stride},
            {hop.timeout_ns, hop.error, hop.error_code}, {packets_in->mirror, layout.row_stride}, stream,
            {nullptr, wait.ahead_blocks}));
        link.chained_to_wait = true;
      }
      const int64_t q_size = o.attention.num_q_heads * o.attention.head_dim;
      out = out_.as<float>() + r.first * q_size;
      out_stride = q_size;
      if (packets_out->segments == o.attention.num_kv_heads) {
        link.out_packets = packets_out->packets;
      } else {
        send_packets = true;
      }
    } else {
      const bool polls = lines_in != nullptr;
      const bool waits = polls || link.ready != nullptr;
      const ChunkWait& wait = WaitOf(chunk, waits, polls, r.count, kc::DecodeBlocks(o.attention, plan, r.count),
                                     polls ? kMostPollingBlocks : kMostWaitingBlocks);
      if (polls) {
        link.lines = lines_in->lines;
        link.lines_mirror = lines_in->mirror;
      }
      if (!wait.in_launch && waits) {
        // A kernel queued ahead waits for the rows; the launch, chained to it, starts once they
        // have come and finds them there.
        if (polls) {
          LAMINA_RETURN_IF_ERROR(kc::ReceiveLines(lines_in->lines, layout.row_stride, hop.tag, hop.timeout_ns,
                                                  hop.error, hop.error_code, nullptr, r.count, layout.row_stride,
                                                  nullptr, layout.row_stride, stream, wait.ahead_blocks,
                                                  kc::NextKernel::kStartsOnceIn));
        } else {
          LAMINA_RETURN_IF_ERROR(
              kc::WaitFlag(link.ready, link.ready_value, hop.timeout_ns, hop.error, hop.error_code, stream));
        }
        link.chained_to_wait = true;
      }
    }
    float* workspace = workspace_.as<float>() + chunk * workspace_floats_;
    LAMINA_RETURN_IF_ERROR(pool_->LinkedDecode(layer, plan, rows + layout.q_offset, layout.row_stride, slot_ids_,
                                               slot_begin_ + r.first, out, out_stride, r.count, workspace, link,
                                               stream));
    if (send_packets) {
      // After a wait gave up the outputs are garbage: the send writes nothing then, and the
      // compute end times out too.
      LAMINA_RETURN_IF_ERROR(kc::SendPackets(out, out_stride, nullptr, r.count, out_stride, packets_out->packets,
                                             kc::PacketsPerRow(out_stride, packets_out->segments), hop.tag,
                                             hop.error, stream, nullptr, packets_out->segments));
    }
    return pacer_.Paced(stream);
  }

 private:
  explicit CudaKvLane(const CudaKvBackend* pool) : pool_(pool) {}

  // With several chunks, each gets a stream (made with the lane) that starts after the step's
  // set-up on the lane's stream; Synchronize joins them.
  absl::Status ForkChunkStreams(int chunks) {
    chunks_ = chunks;
    if (chunks < 2) return absl::OkStatus();
    LAMINA_RETURN_IF_ERROR(step_ready_.Record(stream_.get()));
    for (int c = 0; c < chunks; ++c) {
      LAMINA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(chunk_streams_[c].get(), step_ready_.get(), 0));
    }
    return absl::OkStatus();
  }
  // The most chunks a step may take: a stream each, made with the lane (none for one).
  int max_chunks() const { return std::max(1, static_cast<int>(chunk_streams_.size())); }
  cudaStream_t ChunkStream(int chunk) const { return chunks_ > 1 ? chunk_streams_[chunk].get() : stream_.get(); }

  // The pairs a block of the chunk's warp-per-query-head launches serve this step, `plan` one of
  // them: chosen at its first layer, before its wait (FewestPairsPerBlock), and kept for the others.
  int PairsPerBlock(int chunk, const kc::DecodePlan& plan, int64_t rows) {
    if (!waits_[chunk].has_value()) {
      const kc::AttentionShape& shape = pool_->options().attention;
      pairs_per_block_[chunk] = FewestPairsPerBlock(rows * shape.num_kv_heads, kMostPollingBlocks, step_share_,
                                                    *pool_->spin_budget(), [&](int width) {
                                                      kc::DecodePlan wide = plan;
                                                      wide.pairs_per_block = width;
                                                      return int64_t{kc::PolledBlocksPerSm(shape, wide)};
                                                    });
    }
    return pairs_per_block_[chunk];
  }
  // How the chunk's launches wait for their rows this step: chosen at its first layer (the
  // budget's blocks taken then), kept for its other layers. SetStep sized waits_ with plans_.
  const ChunkWait& WaitOf(int chunk, bool waits, bool lines, int64_t rows, int64_t launch_blocks,
                          int64_t most_in_launch, int64_t launch_blocks_an_sm = 1) {
    std::optional<ChunkWait>& wait = waits_[chunk];
    if (!wait.has_value()) {
      wait = ChooseChunkWait(waits, lines, rows, launch_blocks, most_in_launch, pool_->spin_budget(),
                             launch_blocks_an_sm);
      spinning_ += wait->spinning;
    }
    return *wait;
  }
  // The same for a chunk whose packets a ReceivePackets polls ahead of the launch: its blocks
  // from the start where the budget has room for them (ChunkWait::ahead_blocks), else one warp
  // that waits for the first packet (ahead_blocks 0).
  const ChunkWait& PacketsWaitOf(int chunk, int64_t polling_blocks) {
    std::optional<ChunkWait>& wait = waits_[chunk];
    if (!wait.has_value()) {
      wait = ChunkWait{};
      if (polling_blocks <= kc::kMostPacketPollingBlocks && pool_->spin_budget()->TryTake(polling_blocks)) {
        wait->ahead_blocks = polling_blocks;
      } else {
        pool_->spin_budget()->Take(1);
        wait->ahead_blocks = 0;
      }
      wait->spinning = std::max<int64_t>(1, wait->ahead_blocks);
      spinning_ += wait->spinning;
    }
    return *wait;
  }
  void GiveBackSpinning() {
    pool_->spin_budget()->Give(spinning_);
    pool_->spin_budget()->EndStep(budget_lane_);
    spinning_ = 0;
    waits_.assign(waits_.size(), std::nullopt);
  }

  // Queues what `queue` queues between a pair of events, which TakeBusy reads: the inputs' wait
  // was queued before, as its own launch, so the pair times the work alone.
  template <typename Queue>
  absl::Status Timed(const Queue& queue) {
    if (timed_chunks_ == static_cast<int>(chunk_events_.size())) {
      LAMINA_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create());
      LAMINA_ASSIGN_OR_RETURN(cuda::Event end, cuda::Event::Create());
      chunk_events_.emplace_back(std::move(start), std::move(end));
    }
    const auto& [start, end] = chunk_events_[timed_chunks_++];
    LAMINA_RETURN_IF_ERROR(start.Record(stream_.get()));
    absl::Status queued = queue();
    LAMINA_RETURN_IF_ERROR(end.Record(stream_.get()));
    return queued;
  }

  // The chunk's k/v store and attention into out_, unlinked.
  absl::Status QueueAttention(int64_t layer, int chunk, const RowRange& r, const float* rows,
                              const QkvLayout& layout) {
    const KvBackendOptions& o = pool_->options();
    const int64_t q_size = o.attention.num_q_heads * o.attention.head_dim;
    LAMINA_RETURN_IF_ERROR(pool_->StoreRows(layer, rows + layout.k_offset, rows + layout.v_offset, layout.row_stride,
                                            write_slots_ + r.first, r.count, stream_.get()));
    return pool_->Decode(layer, plans_[chunk], rows + layout.q_offset, layout.row_stride, slot_ids_,
                         slot_begin_ + r.first, out_.as<float>() + r.first * q_size, q_size, r.count,
                         workspace_.as<float>(), stream_.get());
  }

  const CudaKvBackend* pool_;
  cuda::Stream stream_;
  cuda::Event pool_writes_;
  std::vector<cuda::Stream> chunk_streams_;  // [max_chunks] (none for 1): a step's chunks, side by side
  cuda::Event step_ready_;                   // the step's set-up, which they wait for
  cuda::QueuePacer pacer_;                   // ends each Queue* call's unit: kMostQueuedUnits ahead
  int chunks_ = 1;
  cuda::PinnedBuffer host_;    // int32: the step's lists, staged
  std::vector<cuda::PinnedBuffer> retired_;  // outgrown host_ buffers (freeing may wait for the device)
  cuda::DeviceBuffer lists_;   // int32: [write slots][slot ids][slot begins]
  int32_t* write_slots_ = nullptr;
  int32_t* slot_ids_ = nullptr;
  int32_t* slot_begin_ = nullptr;
  cuda::DeviceBuffer out_;        // float [sequences, q_size]
  cuda::DeviceBuffer workspace_;  // float: [chunks][workspace_floats_] linked, or one unlinked chunk's
  int64_t workspace_floats_ = 1;  // a linked chunk's
  cuda::DeviceBuffer counters_;   // uint32 [chunks][chunk_counters_], zeroed
  int64_t chunk_counters_ = 0;    // LinkedDecodeCounters of the largest chunk
  cuda::DeviceBuffer busy_ns_;    // uint64 [2]: linked launches' busy time (DecodeLink::busy_ns)
  cuda::DeviceBuffer busy_starts_;  // uint64 [chunks]: each chunk's DecodeLink::busy_start
  std::vector<std::pair<cuda::Event, cuda::Event>> chunk_events_;  // around unlinked chunks
  int timed_chunks_ = 0;  // of chunk_events_, recorded since the last TakeBusy
  std::vector<kc::DecodePlan> plans_;               // per chunk, run one after another (unlinked)
  std::vector<kc::DecodePlan> side_by_side_plans_;  // per chunk, run side by side (linked)
  std::vector<std::optional<ChunkWait>> waits_;     // per chunk, once its first layer is queued
  std::vector<int> pairs_per_block_;                // per chunk, with waits_ (PairsPerBlock)
  int64_t spinning_ = 0;                            // the budget's blocks this step holds
  int budget_lane_ = 0;                             // the lane's id in the budget
  int64_t step_share_ = 0;                          // its share of the budget this step (BeginStep)
  int64_t rows_ = 0;
  int64_t max_context_ = 0;  // the step's longest context
};

}  // namespace

absl::StatusOr<std::unique_ptr<LocalKvStep>> CudaKvBackend::NewLocalStep() { return NewCudaLocalStep(this); }

absl::StatusOr<std::unique_ptr<DeviceKvLane>> CudaKvBackend::NewDeviceLane(int max_chunks) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvLane> lane, CudaKvLane::Create(this, max_chunks));
  return std::unique_ptr<DeviceKvLane>(std::move(lane));
}

}  // namespace cuda_kv

absl::StatusOr<std::unique_ptr<KvBackend>> CreateCudaKvBackend(const KvBackendOptions& options, int device) {
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<cuda_kv::CudaKvBackend> backend,
                          cuda_kv::CudaKvBackend::Create(options, device));
  return std::unique_ptr<KvBackend>(std::move(backend));
}

}  // namespace lamina
