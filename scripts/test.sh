#!/usr/bin/env bash
# Builds everything and runs the whole test suite, then the system tests
# again under AddressSanitizer and ThreadSanitizer (scripts/sanitizers.sh),
# then examples/bazel_consumer, a workspace that depends on this checkout
# (scripts/consumer_test.sh), then the Python wheel built from an sdist and
# used in a fresh venv (scripts/wheel_test.sh, one test), and prints
# "N passed, N failed" counted from Bazel's test summaries of all these runs
# and the wheel test's result.
# Extra arguments go to the main `bazel test` (e.g. --test_output=all).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
log=$(mktemp)
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
# It labels its summary lines "asan //..." and "tsan //...".
bash scripts/sanitizers.sh 2>&1 | tee -a "$log"
san_rc=${PIPESTATUS[0]}
# It labels its summary lines "consumer //...".
bash scripts/consumer_test.sh 2>&1 | tee -a "$log"
consumer_rc=${PIPESTATUS[0]}
# Bounded: its Bazel build is the longest part (about 5 minutes cold).
timeout 1200 bash scripts/wheel_test.sh 2>&1 | tee -a "$log"
wheel_rc=${PIPESTATUS[0]}
passed=$(grep -cE '^((asan|tsan|consumer) )?//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^((asan|tsan|consumer) )?//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$log")
rm -f "$log"
if [ "$wheel_rc" -eq 0 ]; then
  passed=$((passed + 1))
else
  echo "scripts/wheel_test.sh exited with $wheel_rc" >&2
  failed=$((failed + 1))
fi
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $rc (a build error?)" >&2
  failed=1
fi
if [ "$san_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "the sanitizer runs exited with $san_rc (a build error?)" >&2
  failed=1
fi
if [ "$consumer_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "examples/bazel_consumer exited with $consumer_rc (a build error?)" >&2
  failed=1
fi
echo "${passed} passed, ${failed} failed"
[ "$rc" -eq 0 ] && [ "$san_rc" -eq 0 ] && [ "$consumer_rc" -eq 0 ] &&
  [ "$wheel_rc" -eq 0 ]
