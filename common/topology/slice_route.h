// Where a batch's slices run when a step spans several compute nodes (replicas, in topology
// order). Slice k is what runs between attention k - 1 and attention k (slice 0 starts from the
// embedding, slice num_layers ends with the LM head), and attention k runs where slice k ran.
//   - Rotational pipelining (the paper's section 5.1): slice k of batch j runs on replica
//     (j + k) mod R, so after each attention a batch moves on to the next replica.
//   - A layer split (compute nodes with `layers: [first, end)`): replica r computes its layers
//     for every batch: slice 0 runs on replica 0 and slice k > 0 on the replica holding layer
//     k - 1. So a replica runs its layers' o_proj and MLP, and the q/k/v projections and
//     attention of the layers after each of them (its first layer's belong to the replica before).
// Plain value; thread-safe to read.
#ifndef LAMINA_COMMON_TOPOLOGY_SLICE_ROUTE_H_
#define LAMINA_COMMON_TOPOLOGY_SLICE_ROUTE_H_

#include <cstdint>
#include <vector>

namespace lamina {

struct SliceRoute {
  int batch = 0;
  int replica = 0;  // this node's index among the compute nodes
  int replicas = 1;
  // A layer split: each replica's first layer, ascending from 0; empty under rotation.
  std::vector<int64_t> first_layers;

  int OwnerOf(int64_t slice) const {
    if (first_layers.empty()) return static_cast<int>((batch + slice) % replicas);
    int owner = 0;
    for (int r = 0; r < static_cast<int>(first_layers.size()); ++r) {
      if (first_layers[r] <= slice - 1) owner = r;
    }
    return owner;
  }
  bool Owns(int64_t slice) const { return OwnerOf(slice) == replica; }
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TOPOLOGY_SLICE_ROUTE_H_
