#!/usr/bin/env bash
# Runs the one-GPU test programs under compute-sanitizer: memcheck over the kernel, compute-node and
# memory-node tests, synccheck over the kernel tests. Exits non-zero if a tool reports an error or a
# test fails. The tests that run a kernel beside another that spins on a flag are left out: under
# the tool they time out (tests/sanitizers/README.md).
#
#   bash tests/sanitizers/gpu_memcheck.sh [BUILD_DIR]      (default: build)
set -uo pipefail
build=${1:-build}
sanitizer=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
[ -x "$sanitizer" ] || { echo "gpu_memcheck: no compute-sanitizer at $sanitizer" >&2; exit 2; }
spinning='GemmTest.*:CudaKvLaneTest.LinkedChunksRunSideBySide:CudaKvLaneTest.LanesWaitingForRowsLeaveSmsToALaneWhoseRowsCame'
failed=0
check() {  # tool program
  local log
  log=$(mktemp)
  "$sanitizer" --tool "$1" --error-exitcode 3 --print-limit 20 "$build/tests/$2" --gtest_filter="-$spinning" \
    > "$log" 2>&1
  local rc=$?
  echo "$1 $2: exit $rc, $(grep -m1 'ERROR SUMMARY' "$log" | sed 's/^=* *//')"
  if [ $rc -ne 0 ]; then
    grep -E '^\[  FAILED|^========= [A-Z]' "$log" | head -20
    failed=1
  fi
  rm -f "$log"
}
for program in kernels_cuda_test timing_cuda_test compute_node_cuda_test kv_cuda_test kv_lane_cuda_test; do check memcheck $program; done
check synccheck kernels_cuda_test
exit $failed
