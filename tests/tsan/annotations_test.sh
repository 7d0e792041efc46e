#!/usr/bin/env bash
# Every case of annotation_cases (tests/tsan/cases.h), built with
# --config=tsan: the synced form must exit 0 with no ThreadSanitizer report,
# the racy form must report a data race on shared_data. And the control:
# without the annotations, even the synced `lock` case reports one, because
# Debian's Abseil is not built with TSan.
#
#   annotations_test.sh ANNOTATED_CASES UNANNOTATED_CASES
set -uo pipefail
cases="$1"
plain="$2"
log="$(mktemp)"
# The racy cases report on purpose: to their stderr, not to the report
# folder of check_reports.sh.
export TSAN_OPTIONS="${TSAN_OPTIONS:-} log_path=stderr"

failures=0
got=
# run_case BINARY CASE MODE clean|race: runs it, sets $got; true if as
# expected.
run_case() {
  "$1" "$2" "$3" >"$log" 2>&1
  local rc=$? reports races
  reports=$(grep -c 'WARNING: ThreadSanitizer' "$log")
  races=$(grep -c "Location is global '.*shared_data'" "$log")
  if [ "$rc" -eq 0 ] && [ "$reports" -eq 0 ]; then
    got=clean
  elif [ "$reports" -gt 0 ] && [ "$reports" -eq "$races" ]; then
    got=race
  else
    got="exit $rc, $reports report(s), $races on shared_data"
  fi
  [ "$got" = "$4" ]
}

# report BINARY CASE MODE clean|race: prints the last run's outcome, counts
# a failure.
report() {
  printf '%-14s %-32s %-7s %s\n' "$(basename "$1")" "$2" "$3" "$got"
  if [ "$got" != "$4" ]; then
    echo "  expected $4; its output:"
    sed 's/^/  | /' "$log"
    failures=$((failures + 1))
  fi
}

names=$("$cases" --list) || exit 1
for name in $names; do
  run_case "$cases" "$name" synced clean
  report "$cases" "$name" synced clean
  # TSan can miss a race now and then (it drops a report whose other stack
  # it cannot restore); an annotation that orders too much misses it every
  # time. So a racy case gets three runs to report one.
  for try in 1 2 3; do
    run_case "$cases" "$name" racy race && break
  done
  report "$cases" "$name" racy race
done
run_case "$plain" lock synced race
report "$plain" lock synced race

rm -f "$log"
if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed (built without --config=tsan?)"
  exit 1
fi
echo "all cases as expected"
