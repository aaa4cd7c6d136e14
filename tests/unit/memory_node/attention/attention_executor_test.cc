#include "memory_node/attention/attention_executor.h"

#include <vector>

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

}  // namespace
}  // namespace lamina
