#!/usr/bin/env bash
# Builds everything and runs the whole test suite, then prints
# "N passed, N failed" counted from Bazel's test summary. Extra arguments go
# to `bazel test` (e.g. --config=asan).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
log=$(mktemp)
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$log")
rm -f "$log"
echo "${passed} passed, ${failed} failed"
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $rc (a build error?)" >&2
fi
exit "$rc"
