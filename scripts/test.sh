#!/usr/bin/env bash
# Builds everything and runs the whole test suite: the quick tests
# (`bazel test //...`), the long ones (soak and fuzz, tagged "long"), the
# system tests again under AddressSanitizer and ThreadSanitizer
# (scripts/sanitizers.sh), and the clang build with -Wthread-safety that
# checks the locking annotations. Prints "N passed, N failed", counted from
# Bazel's test summaries of every run (a failed build step counts as one
# failure).
# Extra arguments go to the main `bazel test` (e.g. --test_output=all).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
log=$(mktemp)
failed_steps=0

# step NAME COMMAND...: runs one step, its output in the log.
step() {
  local name="$1"
  shift
  local start=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "step ${name}: exit ${rc}, $((SECONDS - start)) s" | tee -a "$log"
  if [ "$rc" -ne 0 ]; then failed_steps=$((failed_steps + 1)); fi
}

step tests bazel test --config=ci //... "$@"
step long-tests bazel test --config=ci --config=long //...
# It labels its summary lines "asan //..." and "tsan //...".
step sanitizers bash scripts/sanitizers.sh --config=ci
step thread-safety bazel build --config=ci --config=thread-safety \
  //kernels/... //client/... //server/...

passed=$(grep -cE '^((asan|tsan) )?//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^((asan|tsan) )?//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$log")
rm -f "$log"
if [ "$failed_steps" -gt 0 ] && [ "$failed" -eq 0 ]; then
  echo "$failed_steps step(s) failed without a failed test (a build error?)" >&2
  failed=$failed_steps
fi
echo "${passed} passed, ${failed} failed"
[ "$failed_steps" -eq 0 ]
