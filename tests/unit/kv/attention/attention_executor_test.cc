#include "kv/attention/attention_executor.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/tensor/dtype.h"
#include "common/tensor/float8.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

std::unique_ptr<AttentionExecutor> Make(int64_t slots) {
  auto executor = AttentionExecutor::Create({2, slots, {2, 1, 4, 0}});
  EXPECT_TRUE(executor.ok());
  return std::move(*executor);
}

TEST(AttentionExecutorTest, ReserveGrowsSequencesAndFreeReturnsSlots) {
  auto e = Make(10);
  Reservation first[] = {{1, 4}};
  ASSERT_TRUE(e->Reserve(first).ok());
  Reservation second[] = {{1, 6}, {2, 3}, {2, 2}};
  ASSERT_TRUE(e->Reserve(second).ok());
  EXPECT_EQ(e->num_free_slots(), 1);
  EXPECT_EQ(e->num_sequences(), 2);
  Reservation too_many[] = {{3, 1}, {1, 7}, {4, 1}};
  EXPECT_EQ(e->Reserve(too_many).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(e->num_sequences(), 2) << "a failed reservation is all or nothing";
  EXPECT_EQ(e->num_free_slots(), 1);
  e->Free(1);
  EXPECT_EQ(e->num_free_slots(), 7);
}

TEST(AttentionExecutorTest, UnknownSequenceOrUnreservedPositionIsInvalidArgument) {
  auto e = Make(10);
  std::vector<float> qkv(2 * 4 + 2 * 4, 1.0f), out(8);
  DecodeEntry unknown{9, 0};
  EXPECT_EQ(e->Decode(0, {&unknown, 1}, qkv.data(), {16, 0, 8, 12}, out.data(), 8).code(),
            absl::StatusCode::kInvalidArgument);
  Reservation r[] = {{1, 2}};
  ASSERT_TRUE(e->Reserve(r).ok());
  DecodeEntry beyond{1, 2};
  EXPECT_EQ(e->Decode(0, {&beyond, 1}, qkv.data(), {16, 0, 8, 12}, out.data(), 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->StoreKv(5, 1, 0, 1, qkv.data(), qkv.data(), 4).code(), absl::StatusCode::kInvalidArgument);
}

TEST(AttentionExecutorTest, SingleTokenAttentionReturnsItsValue) {
  auto e = Make(4);
  Reservation r[] = {{7, 1}};
  ASSERT_TRUE(e->Reserve(r).ok());
  // Row: q (2 heads x 4), k (1 x 4), v (1 x 4).
  std::vector<float> qkv = {1, 2, 3, 4, 5, 6, 7, 8, 0.5f, 0.5f, 0.5f, 0.5f, 9, 8, 7, 6};
  std::vector<float> out(8);
  DecodeEntry entry{7, 0};
  ASSERT_TRUE(e->Decode(1, {&entry, 1}, qkv.data(), {16, 0, 8, 12}, out.data(), 8).ok());
  EXPECT_EQ(out, (std::vector<float>{9, 8, 7, 6, 9, 8, 7, 6}));
}

// A device step's rows go in linked launches only while each sequence has one row: a prompt
// continuing on the decode path has several, each attending over the ones before it.
TEST(AttentionExecutorTest, AStepMayGoLinkedOnlyWithOneRowASequence) {
  EXPECT_TRUE(AttentionExecutor::MayLink({}));
  EXPECT_TRUE(AttentionExecutor::MayLink({{1, 4}, {2, 4}, {3, 0}}));
  EXPECT_FALSE(AttentionExecutor::MayLink({{1, 4}, {2, 4}, {1, 5}}));
  EXPECT_FALSE(AttentionExecutor::MayLink({{9, 0}, {9, 1}}));
}

// A store's pieces name their transfers, counting up from 0 one at a time; a transfer's rows are
// its pieces'.
TEST(AttentionExecutorTest, AStoresTransfersHoldTheirPiecesRowsAndMustCountUp) {
  using Piece = AttentionExecutor::StorePiece;
  auto rows = AttentionExecutor::TransferRows({Piece{1, 0, 5, 0}, Piece{2, 0, 3, 0}, Piece{3, 0, 7, 1},
                                               Piece{3, 7, 2, 2}, Piece{4, 0, 1, 2}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, (std::vector<int64_t>{8, 7, 3}));
  EXPECT_TRUE(AttentionExecutor::TransferRows({})->empty());

  auto skips = AttentionExecutor::TransferRows({Piece{1, 0, 5, 0}, Piece{2, 0, 3, 2}});
  EXPECT_EQ(skips.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(skips.status().message().find("store piece 1 (sequence 2) is in transfer 2, after transfer 0"),
            std::string::npos)
      << skips.status();
  EXPECT_FALSE(AttentionExecutor::TransferRows({Piece{1, 0, 5, 1}}).ok());   // not from 0
  EXPECT_FALSE(AttentionExecutor::TransferRows({Piece{1, 0, 5, -1}}).ok());  // nor before it
  EXPECT_FALSE(AttentionExecutor::TransferRows({Piece{1, 0, 5, 0}, Piece{2, 0, 5, 1}, Piece{3, 0, 5, 0}}).ok());
}

TEST(AttentionExecutorTest, ForkSharesTheSlotsSoBothSequencesAttendAlike) {
  auto e = Make(8);
  Reservation r[] = {{1, 2}};
  ASSERT_TRUE(e->Reserve(r).ok());
  std::vector<float> kv = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int layer = 0; layer < 2; ++layer) ASSERT_TRUE(e->StoreKv(layer, 1, 0, 2, kv.data(), kv.data(), 4).ok());
  ASSERT_TRUE(e->Fork(1, 2).ok());
  EXPECT_EQ(e->num_free_slots(), 6) << "a fork stores the shared positions once";
  EXPECT_EQ(e->num_shared_slots(), 2);
  EXPECT_EQ(e->StoreKv(0, 2, 1, 1, kv.data(), kv.data(), 4).code(), absl::StatusCode::kFailedPrecondition)
      << "a shared position must not be overwritten";
  Reservation grow[] = {{1, 3}, {2, 3}};
  ASSERT_TRUE(e->Reserve(grow).ok());
  std::vector<float> qkv = {1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 9, 9, 9, 9};
  std::vector<float> out1(8), out2(8);
  DecodeEntry d1{1, 2}, d2{2, 2};
  ASSERT_TRUE(e->Decode(1, {&d1, 1}, qkv.data(), {16, 0, 8, 12}, out1.data(), 8).ok());
  ASSERT_TRUE(e->Decode(1, {&d2, 1}, qkv.data(), {16, 0, 8, 12}, out2.data(), 8).ok());
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(e->Fork(9, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Fork(1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Fork(1, 4, 9).code(), absl::StatusCode::kInvalidArgument);
  e->Free(1);
  EXPECT_EQ(e->num_shared_slots(), 0);
  EXPECT_EQ(e->num_free_slots(), 5) << "sequence 2 still holds the two shared slots and its own";
  e->Free(2);
  EXPECT_EQ(e->num_free_slots(), 8);
}

// The shape of the element type tests below: 8 query heads over 2 kv heads of 16 dims, a prompt of
// 21 tokens then one decode step, each token's q, k and v in a row of kStride floats.
const kernels::cpu::AttentionShape kShape{8, 2, 16, 0};
constexpr int64_t kQ = 8 * 16, kKv = 2 * 16, kStride = kQ + 2 * kKv, kPrompt = 21;

// Random q, k, v rows for the prompt and the decoded token.
std::vector<float> RandomRows(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> qkv((kPrompt + 1) * kStride);
  for (float& x : qkv) x = dist(rng);
  return qkv;
}

// A pool of `dtype` stores the prompt's k/v of `rows` (layer 1), then decodes the last row over
// them: the attention output.
std::vector<float> StoreThenDecode(DType dtype, const std::vector<float>& rows) {
  auto e = AttentionExecutor::Create({2, 64, kShape, -1, dtype});
  EXPECT_TRUE(e.ok()) << e.status();
  Reservation r[] = {{3, kPrompt + 1}};
  EXPECT_TRUE((*e)->Reserve(r).ok());
  EXPECT_TRUE((*e)->StoreKv(1, 3, 0, kPrompt, rows.data() + kQ, rows.data() + kQ + kKv, kStride).ok());
  std::vector<float> out(kQ);
  DecodeEntry entry{3, kPrompt};
  EXPECT_TRUE(
      (*e)->Decode(1, {&entry, 1}, rows.data() + kPrompt * kStride, {kStride, 0, kQ, kQ + kKv}, out.data(), kQ).ok());
  return out;
}

// A bfloat16 pool rounds each k/v value it stores to nearest even and attends over those values:
// its outputs equal, bit for bit, a float32 pool's that was given the rounded values, and differ
// from one given the values themselves. Prompt stores and decode steps both.
TEST(AttentionExecutorTest, ABfloat16PoolAttendsOverTheRoundedValues) {
  const std::vector<float> qkv = RandomRows(5);
  std::vector<float> rounded = qkv;
  for (float& x : rounded) x = BFloat16ToFloat(FloatToBFloat16(x));
  // Only the cache is rounded, not q.
  std::vector<float> rounded_kv = rounded;
  for (int64_t t = 0; t <= kPrompt; ++t) std::copy_n(&qkv[t * kStride], kQ, &rounded_kv[t * kStride]);
  const std::vector<float> bf16 = StoreThenDecode(DType::kBF16, qkv);
  EXPECT_EQ(bf16, StoreThenDecode(DType::kF32, rounded_kv));
  EXPECT_NE(bf16, StoreThenDecode(DType::kF32, qkv));
  EXPECT_NE(bf16, StoreThenDecode(DType::kF32, rounded));

  EXPECT_EQ(AttentionExecutor::Create({2, 64, kShape, -1, DType::kF16}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The largest difference between two outputs.
float MaxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  float most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::fabs(a[i] - b[i]));
  return most;
}

// A float8 pool quantizes each stored (token, kv head) to e4m3 with its own scale and attends over
// code × scale: its outputs are a float32 pool's given those values, to float rounding, and not a
// float32 pool's given the values themselves. Prompt stores and decode steps both. (A GPU's
// float8 pool matches this one: CudaKvLaneTest.AFloat8PoolStoresTheCpuPoolsBitsAndAttendsAsItDoes.)
TEST(AttentionExecutorTest, AFloat8PoolAttendsOverEachHeadsScaledCodes) {
  const std::vector<float> qkv = RandomRows(6);
  std::vector<float> dequantized = qkv;
  for (int64_t t = 0; t <= kPrompt; ++t) {
    for (int64_t head = 0; head < 4; ++head) {  // 2 heads of k, then 2 of v
      float* row = &dequantized[t * kStride + kQ + head * 16];
      uint8_t codes[16];
      float scale;
      QuantizeFloat8E4M3(row, 1, 16, codes, &scale);
      for (int i = 0; i < 16; ++i) row[i] = Float8E4M3ToFloat(codes[i]) * scale;
    }
  }
  const std::vector<float> float8 = StoreThenDecode(DType::kF8E4M3, qkv);
  EXPECT_LT(MaxDifference(float8, StoreThenDecode(DType::kF32, dequantized)), 1e-6);
  EXPECT_GT(MaxDifference(float8, StoreThenDecode(DType::kF32, qkv)), 1e-3);
}

// Rank r of `ranks`' rows: its query heads, then its kv heads of k and of v (KvHeadWindow).
std::vector<float> RankRows(const std::vector<float>& rows, int r, int ranks) {
  const int64_t q = kQ / ranks, kv = kKv / ranks;
  std::vector<float> out;
  for (int64_t t = 0; t <= kPrompt; ++t) {
    const float* row = &rows[t * kStride];
    out.insert(out.end(), row + r * q, row + (r + 1) * q);
    out.insert(out.end(), row + kQ + r * kv, row + kQ + (r + 1) * kv);
    out.insert(out.end(), row + kQ + kKv + r * kv, row + kQ + kKv + (r + 1) * kv);
  }
  return out;
}

// Tensor-parallel ranks each store and attend their own kv heads of the same sequence in one
// pool (head-level partitioning): their outputs, side by side, are the whole heads' output, bit
// for bit, in float32 and bfloat16 pools. Windows outside the heads, and those of a float8 pool,
// are refused before anything is written.
TEST(AttentionExecutorTest, RanksAttendingTheirOwnHeadsGiveTheWholeHeadsOutput) {
  const std::vector<float> qkv = RandomRows(7);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> whole = StoreThenDecode(dtype, qkv);
    auto e = AttentionExecutor::Create({2, 64, kShape, -1, dtype});
    ASSERT_TRUE(e.ok()) << e.status();
    Reservation r[] = {{3, kPrompt + 1}};
    std::vector<float> joined;
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE((*e)->Reserve(r).ok()) << "every rank reserves the same positions";
      const std::vector<float> rows = RankRows(qkv, rank, 2);
      const int64_t q = kQ / 2, kv = kKv / 2, stride = q + 2 * kv;
      const KvHeadWindow heads{rank, 1};
      ASSERT_TRUE((*e)->StoreKvHeads(heads, 1, 3, 0, kPrompt, rows.data() + q, rows.data() + q + kv, stride).ok());
      std::vector<float> out(q);
      DecodeEntry entry{3, kPrompt};
      ASSERT_TRUE((*e)->DecodeHeads(heads, 1, {&entry, 1}, rows.data() + kPrompt * stride, {stride, 0, q, q + kv},
                                    out.data(), q).ok());
      joined.insert(joined.end(), out.begin(), out.end());
    }
    EXPECT_EQ(joined, whole);
    EXPECT_EQ((*e)->num_free_slots(), 64 - (kPrompt + 1)) << "the ranks share the sequence's slots";
  }

  auto e = AttentionExecutor::Create({2, 64, kShape, -1, DType::kF32});
  ASSERT_TRUE(e.ok());
  for (const KvHeadWindow& bad : {KvHeadWindow{1, 2}, KvHeadWindow{-1, 1}, KvHeadWindow{0, 0}}) {
    EXPECT_EQ((*e)->CheckHeadWindow(bad).code(), absl::StatusCode::kInvalidArgument) << bad.first << "+" << bad.count;
  }
  auto float8 = AttentionExecutor::Create({2, 64, kShape, -1, DType::kF8E4M3});
  ASSERT_TRUE(float8.ok());
  EXPECT_EQ((*float8)->CheckHeadWindow({1, 1}).code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE((*float8)->CheckHeadWindow({0, 2}).ok()) << "whole heads need no window";
}

}  // namespace
}  // namespace lamina
