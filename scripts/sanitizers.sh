#!/usr/bin/env bash
# The system tests again under AddressSanitizer (UBSan's default checks and
# LeakSanitizer off), then under ThreadSanitizer: the aggregator binary,
# the workers and the tests are rebuilt with --config=asan, then with
# --config=tsan (which links tests/tsan's annotations of Debian's
# uninstrumented Abseil and gRPC, and fails a test on any report of it or
# of a process it starts; README "Faults, bad input and load" says why
# that is sound). The TSan run also checks the annotations themselves
# (//tests/tsan:annotations_test). Each run's "//target STATUS" lines are
# printed prefixed with "asan " or "tsan "; scripts/test.sh runs this after
# the main suite and counts them. Both runs happen even if the first fails;
# the exit status is nonzero if either did. Extra arguments go to both
# `bazel test`s.
set -uo pipefail
cd "$(dirname "$0")/.."
system_tests=(//tests:system_test //tests:bad_input_test //tests:fault_test)

# run NAME TARGET... : bazel test --config=NAME, its summary lines labelled.
run() {
  local name="$1"
  shift
  bazel test --config="$name" "$@" 2>&1 | sed "s|^//|$name //|"
  return "${PIPESTATUS[0]}"
}

run asan "${system_tests[@]}" "$@"
asan_rc=$?
start=$SECONDS
run tsan "${system_tests[@]}" //tests/tsan:annotations_test "$@"
tsan_rc=$?
echo "ThreadSanitizer run: $((SECONDS - start)) s"
[ "$asan_rc" -eq 0 ] && [ "$tsan_rc" -eq 0 ]
