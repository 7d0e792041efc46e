#!/usr/bin/env bash
# Runs a test (the arguments) with every ThreadSanitizer report of it and of
# each process it starts (the aggregator, the workers: they inherit
# TSAN_OPTIONS) written under $TEST_TMPDIR, and fails it if there is any:
# a report counts even when the process that made it was killed or its
# exit status went unchecked. The reports are copied to the test log.
# `bazel test --config=tsan` runs every test through it (.bazelrc).
set -uo pipefail
dir="${TEST_TMPDIR:?check_reports.sh runs under bazel test}/tsan-reports"
mkdir -p "$dir"
# Last, so that it wins over a log_path from --test_env.
export TSAN_OPTIONS="${TSAN_OPTIONS:-} log_path=$dir/report"
"$@"
rc=$?
shopt -s nullglob
reports=("$dir"/report.*)
if ((${#reports[@]} > 0)); then
  for r in "${reports[@]}"; do
    echo "---- ThreadSanitizer, process ${r##*.}:" >&2
    cat "$r" >&2
  done
  echo "ThreadSanitizer reported in ${#reports[@]} process(es)" >&2
  if [ "$rc" -eq 0 ]; then rc=66; fi
fi
exit "$rc"
