#include "compute_node/tensor_parallel/shard.h"

#include <cstring>
#include <utility>
#include <vector>

namespace lamina {
namespace {

// Rows [first, first + count) of each (first, count) piece of a [rows, cols] tensor, stacked.
Tensor Rows(const Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& pieces) {
  const int64_t cols = t.rank() == 2 ? t.dim(1) : 1;
  int64_t rows = 0;
  for (const auto& [first, count] : pieces) rows += count;
  Tensor out(t.rank() == 2 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows});
  float* dst = out.data();
  for (const auto& [first, count] : pieces) {
    std::memcpy(dst, t.data() + first * cols, count * cols * sizeof(float));
    dst += count * cols;
  }
  return out;
}

// Columns [first, first + count) of a [rows, cols] tensor.
Tensor Columns(const Tensor& t, int64_t first, int64_t count) {
  Tensor out({t.dim(0), count});
  for (int64_t r = 0; r < t.dim(0); ++r) std::memcpy(out.row(r), t.row(r) + first, count * sizeof(float));
  return out;
}

}  // namespace

void ShardWeights(int rank, int size, ModelWeights* w) {
  if (size == 1) return;
  const ModelConfig whole = w->config;
  const ModelConfig part = RankConfig(whole, size);
  const int64_t q = part.q_size(), kv = part.kv_size(), inter = part.intermediate_size;
  // This rank's q, k and v rows among the whole model's [q | k | v].
  const std::vector<std::pair<int64_t, int64_t>> qkv_rows = {
      {rank * q, q}, {whole.q_size() + rank * kv, kv}, {whole.q_size() + whole.kv_size() + rank * kv, kv}};
  for (LayerWeights& l : w->layers) {
    if (l.qkv.size() > 0) l.qkv = Rows(l.qkv, qkv_rows);
    if (l.qkv_bias.size() > 0) l.qkv_bias = Rows(l.qkv_bias, qkv_rows);
    if (l.o_proj.size() > 0) l.o_proj = Columns(l.o_proj, rank * q, q);
    if (l.gate_up.size() > 0) l.gate_up = Rows(l.gate_up, {{rank * inter, inter}, {whole.intermediate_size + rank * inter, inter}});
    if (l.down.size() > 0) l.down = Columns(l.down, rank * inter, inter);
  }
  if (w->lm_head.size() > 0) {
    const int64_t vocab = whole.vocab_size / size;
    w->lm_head = Rows(w->lm_head, {{rank * vocab, vocab}});
  }
  w->config = part;
}

}  // namespace lamina
