#!/usr/bin/env bash
# Builds everything and runs the whole test suite, then the system tests
# again under AddressSanitizer and ThreadSanitizer (scripts/sanitizers.sh),
# then examples/bazel_consumer, a workspace that depends on this checkout
# (scripts/consumer_test.sh), and prints "N passed, N failed" counted from
# Bazel's test summaries of all these runs.
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
passed=$(grep -cE '^((asan|tsan|consumer) )?//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^((asan|tsan|consumer) )?//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$log")
rm -f "$log"
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
[ "$rc" -eq 0 ] && [ "$san_rc" -eq 0 ] && [ "$consumer_rc" -eq 0 ]
