#!/usr/bin/env bash
# The system tests again under AddressSanitizer (+ LeakSanitizer and UBSan's
# default checks off): the aggregator binary, the workers and the tests are
# rebuilt with --config=asan. scripts/test.sh runs it after the main suite.
# ThreadSanitizer is not run here; README "Faults, bad input and load"
# says why. Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."
exec bazel test --config=asan \
  //tests:system_test //tests:bad_input_test //tests:fault_test "$@"
