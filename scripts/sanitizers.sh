#!/usr/bin/env bash
# Every C++ unit test (kernels, client, server, relay, testing) and the system
# tests that drive the real binaries with hostile and faulty input, again
# under AddressSanitizer with UndefinedBehaviorSanitizer and LeakSanitizer
# (--config=asan), then under ThreadSanitizer (--config=tsan, which links
# tests/tsan's annotations of Debian's uninstrumented Abseil and gRPC into
# every test through TSAN_DEPS, and fails a test on any report of it or of a
# process it starts; docs/developer.md, "ThreadSanitizer", says why that is
# sound). The TSan run also checks
# the annotations themselves (//tests/tsan:annotations_test). Each run's
# "//target STATUS" lines are printed prefixed with "asan " or "tsan ";
# scripts/test.sh counts them. Both runs happen even if the first fails;
# the exit status is nonzero if either did. Extra arguments go to both
# `bazel test`s.
set -uo pipefail
cd "$(dirname "$0")/.."
targets=(
  //kernels/... //client/... //server/... //testing/...
  //relay/... //tests:system_test //tests:bad_input_test //tests:fault_test
)

# run NAME TARGET... : bazel test --config=NAME of the C++ tests among the
# targets, its summary lines labelled.
run() {
  local name="$1"
  shift
  bazel test --config="$name" --test_lang_filters=cc,sh "$@" 2>&1 |
    sed "s|^//|$name //|"
  return "${PIPESTATUS[0]}"
}

start=$SECONDS
# Tests tagged no_asan or no_tsan say in their BUILD why they are left out.
run asan "${targets[@]}" --test_tag_filters=-no_asan "$@"
asan_rc=$?
echo "AddressSanitizer run: $((SECONDS - start)) s"
start=$SECONDS
run tsan "${targets[@]}" //tests/tsan:annotations_test \
  --test_tag_filters=-slow,-no_tsan "$@"
tsan_rc=$?
echo "ThreadSanitizer run: $((SECONDS - start)) s"
[ "$asan_rc" -eq 0 ] && [ "$tsan_rc" -eq 0 ]
