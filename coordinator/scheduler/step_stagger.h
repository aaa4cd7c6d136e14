// The offsets of staggered pipelining (the paper's section 5.1). With several batches in flight,
// a batch's step is sent no sooner than `offset` after another batch's, so that the batches come to
// the compute nodes' slices in turn rather than all at once: started together, two batches that
// meet on the same compute node at every slice (both batches on one compute node, or batches j and
// j + R under rotation over R compute nodes) would run their slices side by side and their
// attention side by side, and stay so. Once apart, steps of equal length keep them apart.
//
// offset = a decode step's time / (layers x batches): the batches spread evenly over one layer's
// turn of compute and attention. Where the memory nodes are sized as the paper sizes them
// (attention within t_m / (n - 1), t_m a layer's compute), this is the paper's t_m / (n - 1).
// The step time is a running mean over decode-only steps (prefills take longer); until the first,
// no step is held. Thread-compatible: the scheduler's loop owns it.
#ifndef LAMINA_COORDINATOR_SCHEDULER_STEP_STAGGER_H_
#define LAMINA_COORDINATOR_SCHEDULER_STEP_STAGGER_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace lamina {

class StepStagger {
 public:
  StepStagger(int batches, int64_t layers);

  // Batch `batch` sent a step at `when`.
  void Sent(int batch, absl::Time when);
  // A decode-only step took `duration`.
  void DecodeStepTook(absl::Duration duration);

  // How long batch `batch` should hold a step it would send `now`: until `offset()` after the
  // latest step another batch sent. Zero with one batch, or before any decode step was timed.
  absl::Duration Hold(int batch, absl::Time now) const;
  absl::Duration offset() const;

 private:
  int64_t layers_;
  std::vector<absl::Time> sent_;  // per batch; InfinitePast before its first step
  absl::Duration step_ = absl::ZeroDuration();  // running mean of decode steps
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_STEP_STAGGER_H_
