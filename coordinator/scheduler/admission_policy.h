// Which waiting request the scheduler tries to admit next. The scheduler asks again after each
// admission and stops when the chosen request does not fit (it waits for room) or when the policy
// returns nothing.
// Implementations are called on the scheduler's thread only.
#ifndef LAMINA_COORDINATOR_SCHEDULER_ADMISSION_POLICY_H_
#define LAMINA_COORDINATOR_SCHEDULER_ADMISSION_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace lamina {

// What a policy may look at for each waiting request, in arrival order.
struct WaitingRequest {
  uint64_t id;
  int64_t prompt_tokens;
  int64_t kv_slots_needed;
};

class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  // The index into `waiting` to admit next, or nothing.
  virtual std::optional<size_t> Next(const std::vector<WaitingRequest>& waiting) = 0;
};

// First come, first served: always the oldest request, so none starves behind smaller ones.
class FifoPolicy : public AdmissionPolicy {
 public:
  std::optional<size_t> Next(const std::vector<WaitingRequest>& waiting) override {
    if (waiting.empty()) return std::nullopt;
    return 0;
  }
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_ADMISSION_POLICY_H_
