// The reference for a cluster's greedy tokens in the integration tests: single-process mode
// (LocalCluster) on the same model.
#ifndef LAMINA_TESTS_INTEGRATION_SINGLE_PROCESS_H_
#define LAMINA_TESTS_INTEGRATION_SINGLE_PROCESS_H_

#include <cstdint>
#include <vector>

#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"

namespace lamina::testing {

// `max_tokens` greedy ids after `prompt`, not stopped by EOS. A failure fails the calling test.
inline std::vector<int32_t> SingleProcessIds(LocalCluster& local, const std::vector<int32_t>& prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  std::vector<int32_t> ids;
  const absl::Status status = local.Generate({&r, 1}, [&](const TokenEvent& e) { ids.push_back(e.token); });
  EXPECT_TRUE(status.ok()) << status;
  return ids;
}

}  // namespace lamina::testing

#endif  // LAMINA_TESTS_INTEGRATION_SINGLE_PROCESS_H_
