#include "coordinator/scheduler/prefix_cache.h"

#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace lamina {
namespace {

std::vector<int32_t> Tokens(int count, int start = 0) {
  std::vector<int32_t> t(count);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(PrefixCacheTest, FindsTheLongestWholeBlockPrefixLeavingATokenToCompute) {
  PrefixCache cache(4);
  std::vector<int32_t> system = Tokens(10);
  EXPECT_EQ(cache.CacheableLength(system), 8);
  cache.Insert("m0", 100, absl::MakeSpan(system).subspan(0, 8));

  std::vector<int32_t> prompt = Tokens(10);
  prompt.push_back(77);
  auto match = cache.Longest("m0", prompt);
  ASSERT_TRUE(match.has_value());
  EXPECT_EQ(match->cache_seq, 100);
  EXPECT_EQ(match->length, 8);

  std::vector<int32_t> shorter = Tokens(6);  // one whole block matches, a token is left over
  match = cache.Longest("m0", shorter);
  ASSERT_TRUE(match.has_value());
  EXPECT_EQ(match->length, 4);

  std::vector<int32_t> exact = Tokens(8);  // a prompt equal to the prefix still computes its last block
  match = cache.Longest("m0", exact);
  ASSERT_TRUE(match.has_value());
  EXPECT_EQ(match->length, 4);

  std::vector<int32_t> other = Tokens(10, 1);
  EXPECT_FALSE(cache.Longest("m0", other).has_value());
  EXPECT_FALSE(cache.Longest("m1", prompt).has_value()) << "prefixes live on one node";
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedFirstAndForgetsItsPrefixes) {
  PrefixCache cache(2);
  std::vector<int32_t> a = Tokens(4), b = Tokens(4, 10), c = Tokens(4, 20);
  cache.Insert("m", 1, a);
  cache.Insert("m", 2, b);
  cache.Insert("m", 3, c);
  EXPECT_EQ(cache.CachedSlots("m"), 12);
  std::vector<int32_t> a_longer = Tokens(5);
  ASSERT_TRUE(cache.Longest("m", a_longer).has_value());  // a is now the most recent
  EXPECT_EQ(cache.EvictOldest("m"), 2);
  EXPECT_EQ(cache.EvictOldest("m"), 3);
  std::vector<int32_t> b_longer = Tokens(5, 10);
  EXPECT_FALSE(cache.Longest("m", b_longer).has_value());
  EXPECT_EQ(cache.CachedSlots("m"), 4);
  EXPECT_TRUE(cache.Contains("m", a));
  EXPECT_EQ(cache.DropNode("m"), std::vector<SequenceId>{1});  // what the node still holds
  EXPECT_TRUE(cache.DropNode("m").empty());
  EXPECT_EQ(cache.CachedSlots("m"), 0);
  EXPECT_FALSE(cache.EvictOldest("m").has_value());
}

}  // namespace
}  // namespace lamina
