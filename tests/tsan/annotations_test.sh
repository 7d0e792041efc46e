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
# expect BINARY CASE MODE clean|race
expect() {
  "$1" "$2" "$3" >"$log" 2>&1
  local rc=$? reports races got
  reports=$(grep -c 'WARNING: ThreadSanitizer' "$log")
  races=$(grep -c "Location is global '.*shared_data'" "$log")
  if [ "$rc" -eq 0 ] && [ "$reports" -eq 0 ]; then
    got=clean
  elif [ "$reports" -gt 0 ] && [ "$reports" -eq "$races" ]; then
    got=race
  else
    got="exit $rc, $reports report(s), $races on shared_data"
  fi
  printf '%-14s %-32s %-7s %s\n' "$(basename "$1")" "$2" "$3" "$got"
  if [ "$got" != "$4" ]; then
    echo "  expected $4; its output:"
    sed 's/^/  | /' "$log"
    failures=$((failures + 1))
  fi
}

names=$("$cases" --list) || exit 1
for name in $names; do
  expect "$cases" "$name" synced clean
  expect "$cases" "$name" racy race
done
expect "$plain" lock synced race

rm -f "$log"
if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed (built without --config=tsan?)"
  exit 1
fi
echo "all cases as expected"
