// CPU kernels against naive float64 references on random inputs with odd sizes.
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "common/tensor/float8.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/float8_rows.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"

namespace lamina::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double MaxRelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / (den > 0 ? den : 1);
}

constexpr Isa kIsas[] = {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512};

// Runs the kernels with at most one instruction set while in scope (isa.h).
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) { LimitIsa(isa); }
  ~ScopedIsa() { LimitIsa(Isa::kAvx512); }
};

std::string IsaCaseName(const ::testing::TestParamInfo<Isa>& info) { return IsaName(info.param); }

// Skips the test on a CPU that lacks `isa`, saying so.
#define LAMINA_SKIP_IF_UNSUPPORTED(isa) \
  if ((isa) > BestIsa()) GTEST_SKIP() << "this CPU lacks " << IsaName(isa) << " (best: " << IsaName(BestIsa()) << ")"

// Each instruction set's widening of float8 e4m3 codes gives 1/256 of the value Float8E4M3ToFloat
// gives for every code, subnormals included (the NaN codes, never stored, ±480 / 256), in rows of
// 256 codes and of 13 (vectors, then codes one by one).
class Float8RowsTest : public ::testing::TestWithParam<Isa> {};

TEST_P(Float8RowsTest, WidenEveryCodeToItsValueOver256) {
  LAMINA_SKIP_IF_UNSUPPORTED(GetParam());
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  for (const int64_t count : {256, 13}) {
    std::vector<const uint8_t*> rows;
    for (int64_t first = 0; first + count <= 256; first += count) rows.push_back(&codes[first]);
    std::vector<float> got(rows.size() * count, -1.0f);
    WidenFloat8RowsFor(GetParam())(rows.data(), static_cast<int64_t>(rows.size()), count, got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      const float value = Float8E4M3ToFloat(codes[i]);
      const float want = std::isnan(value) ? (codes[i] & 0x80 ? -480.0f : 480.0f) / 256 : value / 256;
      EXPECT_EQ(got[i], want) << "rows of " << count << ", code " << int{codes[i]};
      EXPECT_EQ(std::signbit(got[i]), std::signbit(want)) << "rows of " << count << ", code " << int{codes[i]};
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, Float8RowsTest, ::testing::ValuesIn(kIsas), IsaCaseName);

class MatmulTest : public ::testing::TestWithParam<Isa> {};

TEST_P(MatmulTest, MatchesFloat64ReferenceAtOddSizes) {
  LAMINA_SKIP_IF_UNSUPPORTED(GetParam());
  ScopedIsa isa(GetParam());
  ThreadPool pool(3);
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {1, 17, 9}, {3, 33, 31}, {5, 64, 256}, {7, 130, 257}, {16, 100, 688}, {33, 7, 1000}}) {
    std::vector<float> x = Random(m * k, 1), w = Random(n * k, 2), bias = Random(n, 3), y(m * n);
    Matmul(x.data(), w.data(), bias.data(), y.data(), m, n, k, pool);
    std::vector<double> ref(m * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = bias[j];
        for (int64_t t = 0; t < k; ++t) s += static_cast<double>(x[i * k + t]) * w[j * k + t];
        ref[i * n + j] = s;
      }
    }
    EXPECT_LT(MaxRelativeError(y, ref), 1e-5) << m << "x" << n << "x" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, MatmulTest, ::testing::ValuesIn(kIsas), IsaCaseName);

TEST(RmsNormTest, MatchesDefinition) {
  const int64_t rows = 3, dim = 37;
  std::vector<float> x = Random(rows * dim, 4), w = Random(dim, 5), y(rows * dim);
  RmsNorm(x.data(), w.data(), y.data(), rows, dim, 1e-5);
  std::vector<double> ref(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    double scale = 1 / std::sqrt(ss / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * scale * w[i];
  }
  EXPECT_LT(MaxRelativeError(y, ref), 1e-6);
}

TEST(SwiGluTest, MatchesDefinition) {
  std::vector<float> gate_up = {1.0f, -2.0f, 0.5f, 3.0f, 4.0f, -1.0f}, out(3);
  SwiGlu(gate_up.data(), out.data(), 1, 3);
  for (int i = 0; i < 3; ++i) {
    double g = gate_up[i];
    EXPECT_NEAR(out[i], g / (1 + std::exp(-g)) * gate_up[3 + i], 1e-6);
  }
}

TEST(RopeTest, DefaultScheduleRotatesPairsHalfADimensionApart) {
  RopeConfig config;
  config.theta = 10000;
  Rope rope(config, 4);
  std::vector<float> x = {1, 2, 3, 4};
  int32_t position = 3;
  rope.Apply(x.data(), &position, 1, 1, 4);
  // Pairs (0, 2) and (1, 3), frequencies 1 and 1/100.
  const double a0 = 3 * 1.0, a1 = 3 * 0.01;
  EXPECT_NEAR(x[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(x[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
}

TEST(RopeTest, Llama3ScheduleKeepsHighFrequenciesAndSlowsLowOnes) {
  RopeConfig config;
  config.type = RopeConfig::Type::kLlama3;
  config.theta = 500000;
  config.factor = 8;
  config.low_freq_factor = 1;
  config.high_freq_factor = 4;
  config.original_max_position_embeddings = 8192;
  Rope scaled(config, 128);
  RopeConfig plain_config;
  plain_config.theta = 500000;
  Rope plain(plain_config, 128);
  const auto& s = scaled.inv_freq();
  const auto& p = plain.inv_freq();
  EXPECT_DOUBLE_EQ(s[0], p[0]);             // wavelength 2π: far below 8192/4
  EXPECT_DOUBLE_EQ(s[63], p[63] / 8);        // the longest wavelength: slowed by the factor
  // Within the blended band the result lies between the two.
  int blended = 0;
  for (int i = 0; i < 64; ++i) {
    double wavelen = 2 * M_PI / p[i];
    if (wavelen >= 8192.0 / 4 && wavelen <= 8192.0) {
      EXPECT_LE(s[i], p[i]);
      EXPECT_GE(s[i], p[i] / 8);
      ++blended;
    }
  }
  EXPECT_GT(blended, 0);
}

// softmax(q·Kᵀ/√d)·V for one head in float64.
std::vector<double> NaiveAttention(const float* q, const std::vector<const float*>& keys,
                                   const std::vector<const float*>& values, int64_t d) {
  std::vector<double> scores;
  double max_score = -1e300;
  for (const float* k : keys) {
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += static_cast<double>(q[i]) * k[i];
    s /= std::sqrt(static_cast<double>(d));
    scores.push_back(s);
    max_score = std::max(max_score, s);
  }
  double total = 0;
  for (double& s : scores) total += (s = std::exp(s - max_score));
  std::vector<double> out(d, 0.0);
  for (size_t j = 0; j < keys.size(); ++j) {
    for (int64_t i = 0; i < d; ++i) out[i] += scores[j] / total * values[j][i];
  }
  return out;
}

struct AttentionCase {
  int64_t q_heads, kv_heads, head_dim, tokens, window;
};

// Each shape on each instruction set.
class AttentionTest : public ::testing::TestWithParam<std::tuple<AttentionCase, Isa>> {
 protected:
  void SetUp() override {
    LAMINA_SKIP_IF_UNSUPPORTED(std::get<1>(GetParam()));
    LimitIsa(std::get<1>(GetParam()));
  }
  void TearDown() override { LimitIsa(Isa::kAvx512); }
  AttentionCase Case() const { return std::get<0>(GetParam()); }
};

TEST_P(AttentionTest, PrefillIsCausalSoftmaxAttention) {
  const AttentionCase c = Case();
  const int64_t q_stride = c.q_heads * c.head_dim, kv_stride = c.kv_heads * c.head_dim;
  std::vector<float> q = Random(c.tokens * q_stride, 7), k = Random(c.tokens * kv_stride, 8),
                     v = Random(c.tokens * kv_stride, 9), out(c.tokens * q_stride);
  ThreadPool pool(2);
  PrefillAttention({c.q_heads, c.kv_heads, c.head_dim, c.window}, q.data(), q_stride, k.data(), v.data(),
                   kv_stride, out.data(), q_stride, c.tokens, pool);
  const int64_t group = c.q_heads / c.kv_heads;
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      std::vector<const float*> keys, values;
      int64_t begin = c.window > 0 ? std::max<int64_t>(0, t + 1 - c.window) : 0;
      for (int64_t j = begin; j <= t; ++j) {
        keys.push_back(&k[j * kv_stride + (h / group) * c.head_dim]);
        values.push_back(&v[j * kv_stride + (h / group) * c.head_dim]);
      }
      std::vector<double> ref = NaiveAttention(&q[t * q_stride + h * c.head_dim], keys, values, c.head_dim);
      for (int64_t i = 0; i < c.head_dim; ++i) {
        ASSERT_NEAR(out[t * q_stride + h * c.head_dim + i], ref[i], 1e-5) << "t " << t << " head " << h;
      }
    }
  }
}

TEST_P(AttentionTest, DecodeOverScatteredSlotsEqualsPrefillsLastRow) {
  const AttentionCase c = Case();
  const int64_t q_stride = c.q_heads * c.head_dim, kv_stride = c.kv_heads * c.head_dim;
  std::vector<float> q = Random(c.tokens * q_stride, 10), k = Random(c.tokens * kv_stride, 11),
                     v = Random(c.tokens * kv_stride, 12), prefill(c.tokens * q_stride);
  const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, c.window};
  PrefillAttention(shape, q.data(), q_stride, k.data(), v.data(), kv_stride, prefill.data(), q_stride, c.tokens);
  // Scatter the keys into a cache at shuffled slots.
  const int64_t num_slots = 2 * c.tokens + 3;
  std::vector<int32_t> slots(num_slots);
  for (int32_t i = 0; i < num_slots; ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), std::mt19937(13));
  slots.resize(c.tokens);
  std::vector<float> k_cache(num_slots * kv_stride), v_cache(num_slots * kv_stride), out(q_stride);
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::copy_n(&k[t * kv_stride], kv_stride, &k_cache[slots[t] * kv_stride]);
    std::copy_n(&v[t * kv_stride], kv_stride, &v_cache[slots[t] * kv_stride]);
  }
  const int64_t begin[2] = {0, c.tokens};
  DecodeAttention(shape, &q[(c.tokens - 1) * q_stride], q_stride, k_cache.data(), v_cache.data(), kv_stride,
                  slots.data(), begin, out.data(), q_stride, 1);
  for (int64_t i = 0; i < q_stride; ++i) EXPECT_NEAR(out[i], prefill[(c.tokens - 1) * q_stride + i], 1e-5);
}

// A batch of sequences of many lengths (1 token, across key blocks) over one shuffled slot pool,
// on pools of 1 to 16 threads, so that a work item takes all of a sequence's kv heads, some, or
// one: each query head equals the float64 reference.
TEST_P(AttentionTest, DecodeOfABatchOnAnyThreadCountEqualsTheReference) {
  const AttentionCase c = Case();
  const int64_t q_stride = c.q_heads * c.head_dim, kv_stride = c.kv_heads * c.head_dim, group = c.q_heads / c.kv_heads;
  const std::vector<int64_t> lengths = {1, c.tokens, 16, 17, 3, c.tokens / 2, 33, 2, 15, 40, 5, 64};
  std::vector<int64_t> begin = {0};
  for (int64_t n : lengths) begin.push_back(begin.back() + n);
  const int64_t seqs = static_cast<int64_t>(lengths.size()), total = begin.back();
  std::vector<int32_t> slots(total + 5);
  for (int32_t i = 0; i < static_cast<int32_t>(slots.size()); ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), std::mt19937(14));
  const std::vector<float> q = Random(seqs * q_stride, 15), k_cache = Random(slots.size() * kv_stride, 16),
                           v_cache = Random(slots.size() * kv_stride, 17);
  for (const int threads : {1, 2, 3, 5, 16}) {
    ThreadPool pool(threads);
    std::vector<float> out(seqs * q_stride, -1.0f);
    DecodeAttention({c.q_heads, c.kv_heads, c.head_dim, c.window}, q.data(), q_stride, k_cache.data(), v_cache.data(),
                    kv_stride, slots.data(), begin.data(), out.data(), q_stride, seqs, pool);
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t first = c.window > 0 ? std::max(begin[s], begin[s + 1] - c.window) : begin[s];
      for (int64_t h = 0; h < c.q_heads; ++h) {
        std::vector<const float*> keys, values;
        for (int64_t j = first; j < begin[s + 1]; ++j) {
          keys.push_back(&k_cache[slots[j] * kv_stride + (h / group) * c.head_dim]);
          values.push_back(&v_cache[slots[j] * kv_stride + (h / group) * c.head_dim]);
        }
        const std::vector<double> ref = NaiveAttention(&q[s * q_stride + h * c.head_dim], keys, values, c.head_dim);
        for (int64_t i = 0; i < c.head_dim; ++i) {
          ASSERT_NEAR(out[s * q_stride + h * c.head_dim + i], ref[i], 1e-5)
              << threads << " threads, sequence " << s << ", head " << h << ", dim " << i;
        }
      }
    }
  }
}

// Over a bfloat16 cache, each value read is widened to its float exactly: the outputs equal, bit
// for bit, the float32 call's over a cache of the widened values (so every float32 check holds for
// the bfloat16 path too), on any thread count.
TEST_P(AttentionTest, DecodeOverABfloat16CacheEqualsTheFloatCallOverItsValues) {
  const AttentionCase c = Case();
  const int64_t q_stride = c.q_heads * c.head_dim, kv_stride = c.kv_heads * c.head_dim;
  const std::vector<int64_t> begin = {0, 1, 1 + c.tokens, 18 + c.tokens, 51 + c.tokens};
  const int64_t seqs = static_cast<int64_t>(begin.size()) - 1, total = begin.back();
  std::vector<int32_t> slots(total + 3);
  for (int32_t i = 0; i < static_cast<int32_t>(slots.size()); ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), std::mt19937(24));
  const std::vector<float> q = Random(seqs * q_stride, 25);
  std::vector<float> k_wide = Random(slots.size() * kv_stride, 26), v_wide = Random(slots.size() * kv_stride, 27);
  std::vector<uint16_t> k_bits(k_wide.size()), v_bits(v_wide.size());
  for (size_t i = 0; i < k_wide.size(); ++i) {
    k_bits[i] = FloatToBFloat16(k_wide[i]);
    v_bits[i] = FloatToBFloat16(v_wide[i]);
    k_wide[i] = BFloat16ToFloat(k_bits[i]);
    v_wide[i] = BFloat16ToFloat(v_bits[i]);
  }
  for (const int threads : {1, 3}) {
    ThreadPool pool(threads);
    const AttentionShape shape{c.q_heads, c.kv_heads, c.head_dim, c.window};
    std::vector<float> narrow(seqs * q_stride, -1.0f), wide(seqs * q_stride, -2.0f);
    DecodeAttention(shape, q.data(), q_stride, k_bits.data(), v_bits.data(), kv_stride, slots.data(), begin.data(),
                    narrow.data(), q_stride, seqs, pool);
    DecodeAttention(shape, q.data(), q_stride, k_wide.data(), v_wide.data(), kv_stride, slots.data(), begin.data(),
                    wide.data(), q_stride, seqs, pool);
    for (size_t i = 0; i < narrow.size(); ++i) ASSERT_EQ(narrow[i], wide[i]) << threads << " threads, output " << i;
  }
}

// Over a float8 cache, each code is widened exactly and scaled by its (slot, kv head)'s scale:
// the outputs equal the float64 reference over code × scale, on any thread count. Every seventh
// value is made tiny, so that subnormal codes are read too.
TEST_P(AttentionTest, DecodeOverAFloat8CacheEqualsTheReferenceOverItsScaledValues) {
  const AttentionCase c = Case();
  const int64_t q_stride = c.q_heads * c.head_dim, kv_stride = c.kv_heads * c.head_dim, group = c.q_heads / c.kv_heads;
  const std::vector<int64_t> begin = {0, 1, 1 + c.tokens, 18 + c.tokens, 51 + c.tokens};
  const int64_t seqs = static_cast<int64_t>(begin.size()) - 1, total = begin.back();
  std::vector<int32_t> slots(total + 3);
  for (int32_t i = 0; i < static_cast<int32_t>(slots.size()); ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), std::mt19937(34));
  const int64_t num_slots = static_cast<int64_t>(slots.size());
  const std::vector<float> q = Random(seqs * q_stride, 35);
  std::vector<float> k_wide = Random(num_slots * kv_stride, 36), v_wide = Random(num_slots * kv_stride, 37);
  for (size_t i = 0; i < k_wide.size(); i += 7) k_wide[i] *= 1e-5f, v_wide[i] *= 1e-5f;
  std::vector<uint8_t> k_codes(k_wide.size()), v_codes(v_wide.size());
  std::vector<float> k_scales(num_slots * c.kv_heads), v_scales(num_slots * c.kv_heads);
  for (int64_t r = 0; r < num_slots; ++r) {
    QuantizeFloat8E4M3(&k_wide[r * kv_stride], c.kv_heads, c.head_dim, &k_codes[r * kv_stride],
                       &k_scales[r * c.kv_heads]);
    QuantizeFloat8E4M3(&v_wide[r * kv_stride], c.kv_heads, c.head_dim, &v_codes[r * kv_stride],
                       &v_scales[r * c.kv_heads]);
  }
  int subnormals = 0;
  for (size_t i = 0; i < k_wide.size(); ++i) {
    const int64_t head = static_cast<int64_t>(i) / c.head_dim;  // slot r's head h is head r * kv_heads + h
    k_wide[i] = Float8E4M3ToFloat(k_codes[i]) * k_scales[head];
    v_wide[i] = Float8E4M3ToFloat(v_codes[i]) * v_scales[head];
    subnormals += (k_codes[i] & 0x78) == 0 && (k_codes[i] & 0x7) != 0;
  }
  ASSERT_GT(subnormals, 0);
  for (const int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::vector<float> out(seqs * q_stride, -1.0f);
    DecodeAttention({c.q_heads, c.kv_heads, c.head_dim, c.window}, q.data(), q_stride, k_codes.data(), v_codes.data(),
                    kv_stride, k_scales.data(), v_scales.data(), slots.data(), begin.data(), out.data(), q_stride, seqs,
                    pool);
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t first = c.window > 0 ? std::max(begin[s], begin[s + 1] - c.window) : begin[s];
      for (int64_t h = 0; h < c.q_heads; ++h) {
        std::vector<const float*> keys, values;
        for (int64_t j = first; j < begin[s + 1]; ++j) {
          keys.push_back(&k_wide[slots[j] * kv_stride + (h / group) * c.head_dim]);
          values.push_back(&v_wide[slots[j] * kv_stride + (h / group) * c.head_dim]);
        }
        const std::vector<double> ref = NaiveAttention(&q[s * q_stride + h * c.head_dim], keys, values, c.head_dim);
        for (int64_t i = 0; i < c.head_dim; ++i) {
          ASSERT_NEAR(out[s * q_stride + h * c.head_dim + i], ref[i], 1e-5)
              << threads << " threads, sequence " << s << ", head " << h << ", dim " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Combine(::testing::Values(AttentionCase{4, 4, 16, 37, 0},   // MHA
                                         AttentionCase{8, 2, 32, 70, 0},   // GQA
                                         AttentionCase{6, 1, 64, 33, 0},   // MQA
                                         AttentionCase{6, 3, 16, 45, 0},   // 3 kv heads: uneven shares
                                         AttentionCase{4, 2, 8, 50, 7},    // sliding window
                                         AttentionCase{8, 2, 128, 90, 0},  // Llama's head_dim
                                         AttentionCase{6, 2, 80, 21, 0},   // vectors of dims, then one
                                         AttentionCase{9, 3, 12, 40, 0}),  // 3 query heads, dims left over
                       ::testing::ValuesIn(kIsas)),
    [](const ::testing::TestParamInfo<std::tuple<AttentionCase, Isa>>& info) {
      const AttentionCase c = std::get<0>(info.param);
      return absl::StrCat(c.q_heads, "q", c.kv_heads, "kv", c.head_dim, "d", c.window > 0 ? "window" : "", "_",
                          IsaName(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace lamina::kernels::cpu
