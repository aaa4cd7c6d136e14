#include "common/metrics/histogram.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace lamina {
namespace {

TEST(HistogramTest, AValueOnABoundCountsInThatBoundsBucket) {
  Histogram h({0.1, 1, 10});
  for (double v : {0.0, 0.1, 0.1000001, 1.0, 5.0, 10.0, 10.5, 1e9, -3.0}) h.Observe(v);
  // (-inf, 0.1]: 0, 0.1, -3; (0.1, 1]: 0.1000001, 1; (1, 10]: 5, 10; above: 10.5, 1e9.
  EXPECT_EQ(h.buckets(), (std::vector<int64_t>{3, 2, 2, 2}));
  EXPECT_EQ(h.count(), 9);
  EXPECT_DOUBLE_EQ(h.sum(), 0.0 + 0.1 + 0.1000001 + 1.0 + 5.0 + 10.0 + 10.5 + 1e9 - 3.0);
}

TEST(HistogramTest, NanIsNotCountedAndInfinityGoesAboveEveryBound) {
  Histogram h({1});
  h.Observe(std::nan(""));
  EXPECT_EQ(h.count(), 0);
  h.Observe(std::numeric_limits<double>::infinity());
  EXPECT_EQ(h.buckets(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(h.count(), 1);
}

TEST(HistogramTest, NoBoundsIsOneBucket) {
  Histogram h({});
  h.Observe(2);
  h.Observe(3);
  EXPECT_EQ(h.buckets(), (std::vector<int64_t>{2}));
  EXPECT_DOUBLE_EQ(h.sum(), 5);
}

TEST(HistogramDeathTest, BoundsMustIncrease) {
  EXPECT_DEATH(Histogram({1, 1}), "LAMINA_CHECK failed");
  EXPECT_DEATH(Histogram({2, 1}), "LAMINA_CHECK failed");
  EXPECT_DEATH(Histogram({1, std::numeric_limits<double>::infinity()}), "LAMINA_CHECK failed");
}

}  // namespace
}  // namespace lamina
