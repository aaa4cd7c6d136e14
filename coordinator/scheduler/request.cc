#include "coordinator/scheduler/request.h"

namespace lamina {

void RequestHandle::Push(RequestEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event));
  ready_.notify_all();
}

bool RequestHandle::Pop(RequestEvent* event, absl::Duration wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!ready_.wait_for(lock, absl::ToChronoNanoseconds(wait), [&] { return !events_.empty(); })) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  return true;
}

}  // namespace lamina
