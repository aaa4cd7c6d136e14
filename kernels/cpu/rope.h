// Rotary position embedding (the "rotate half" layout of Hugging Face LLaMA), with the default,
// linear and llama3 frequency schedules. Frequencies and angles are computed in float64.
// Thread-safe after construction.
#ifndef LAMINA_KERNELS_CPU_ROPE_H_
#define LAMINA_KERNELS_CPU_ROPE_H_

#include <cstdint>
#include <vector>

#include "common/model_config/model_config.h"

namespace lamina::kernels::cpu {

class Rope {
 public:
  Rope(const RopeConfig& config, int64_t head_dim);

  // Rotates `num_heads` heads of each token in place. Rows of `x` are `row_stride` floats apart;
  // the heads of a row are contiguous from its start.
  void Apply(float* x,                // [count, row_stride], heads at [0, num_heads * head_dim)
             const int32_t* positions,  // [count]
             int64_t count, int64_t num_heads, int64_t row_stride) const;

  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  int64_t head_dim_;
  std::vector<double> inv_freq_;  // [head_dim / 2]
};

}  // namespace lamina::kernels::cpu

#endif  // LAMINA_KERNELS_CPU_ROPE_H_
