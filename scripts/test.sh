#!/usr/bin/env bash
# Builds everything and runs the whole test suite, step by step: the format
# check (scripts/check_format.sh: clang-format-14 would change nothing), the
# quick tests (`bazel test //...`), the slow ones (soak and fuzz, tagged "slow"),
# every C++ unit test and the system tests again under AddressSanitizer with
# UndefinedBehaviorSanitizer and LeakSanitizer, and under ThreadSanitizer
# (scripts/sanitizers.sh), the clang build with -Wthread-safety that checks
# the locking annotations, examples/bazel_consumer (a workspace that depends
# on this checkout: scripts/consumer_test.sh), and the Python wheel built
# from an sdist and used in a fresh venv (scripts/wheel_test.sh, one test).
# Prints each step's exit status and time, then "N passed, N failed",
# counted from Bazel's test summaries of every step plus the wheel test; a
# step that fails without a failed test (a build error) counts as one.
# Extra arguments go to the main `bazel test` (e.g. --test_output=all).
# docs/developer.md ("What CI runs") describes each step.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
log=$(mktemp)
failed_steps=0
unexplained=0

# step NAME COMMAND...: runs one step, its output in the log.
step() {
  local name="$1"
  shift
  local start=$SECONDS
  local before
  before=$(count FAILED)
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "step ${name}: exit ${rc}, $((SECONDS - start)) s"
  if [ "$rc" -ne 0 ]; then
    failed_steps=$((failed_steps + 1))
    [ "$(count FAILED)" -eq "$before" ] && unexplained=$((unexplained + 1))
  fi
  return "$rc"
}

# count PASSED|FAILED: summary lines of that kind so far, any step's
# (sanitizer and consumer runs label theirs "asan //...", "consumer //...").
count() {
  local kind='PASSED'
  [ "$1" = FAILED ] && kind='(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)'
  grep -cE "^((asan|tsan|consumer) )?//[^ ]+ +(\\(cached\\) )?${kind}" "$log"
}

step format bash scripts/check_format.sh
step tests bazel test --config=ci //... "$@"
step slow-tests bazel test --config=ci --config=slow //...
step sanitizers bash scripts/sanitizers.sh --config=ci
# Clang's analysis is its front end's: the objects compiled without
# optimization or debug info, and not linked, are checked the same, in
# three quarters of the time.
step thread-safety bazel build --config=ci --config=thread-safety \
  --copt=-O0 --copt=-g0 --output_groups=compilation_outputs \
  //kernels/... //client/... //server/...
step consumer bash scripts/consumer_test.sh
# Bounded: its Bazel build is the longest part (about 5 minutes cold).
if step wheel timeout 1200 bash scripts/wheel_test.sh; then
  wheel_passed=1
else
  wheel_passed=0
fi

passed=$(($(count PASSED) + wheel_passed))
failed=$(($(count FAILED) + unexplained))
rm -f "$log"
echo "${passed} passed, ${failed} failed"
[ "$failed_steps" -eq 0 ]
