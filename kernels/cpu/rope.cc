#include "kernels/cpu/rope.h"

#include <cmath>

namespace lamina::kernels::cpu {

Rope::Rope(const RopeConfig& config, int64_t head_dim) : head_dim_(head_dim), inv_freq_(head_dim / 2) {
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double freq = 1.0 / std::pow(config.theta, static_cast<double>(2 * i) / head_dim);
    switch (config.type) {
      case RopeConfig::Type::kDefault:
        break;
      case RopeConfig::Type::kLinear:
        freq /= config.factor;
        break;
      case RopeConfig::Type::kLlama3: {
        // Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        const double old_len = static_cast<double>(config.original_max_position_embeddings);
        const double low_freq_wavelen = old_len / config.low_freq_factor;
        const double high_freq_wavelen = old_len / config.high_freq_factor;
        const double wavelen = 2 * M_PI / freq;
        if (wavelen > low_freq_wavelen) {
          freq /= config.factor;
        } else if (wavelen >= high_freq_wavelen) {
          double smooth = (old_len / wavelen - config.low_freq_factor) /
                          (config.high_freq_factor - config.low_freq_factor);
          freq = (1 - smooth) * freq / config.factor + smooth * freq;
        }
        break;
      }
    }
    inv_freq_[i] = freq;
  }
}

void Rope::Apply(float* x, const int32_t* positions, int64_t count, int64_t num_heads,
                 int64_t row_stride) const {
  const int64_t half = head_dim_ / 2;
  std::vector<float> cos_table(half), sin_table(half);
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      double angle = positions[t] * inv_freq_[i];
      cos_table[i] = static_cast<float>(std::cos(angle));
      sin_table[i] = static_cast<float>(std::sin(angle));
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      float* head = x + t * row_stride + h * head_dim_;
      for (int64_t i = 0; i < half; ++i) {
        float a = head[i], b = head[i + half];
        head[i] = a * cos_table[i] - b * sin_table[i];
        head[i + half] = b * cos_table[i] + a * sin_table[i];
      }
    }
  }
}

}  // namespace lamina::kernels::cpu
