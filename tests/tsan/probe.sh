#!/usr/bin/env bash
# Why ThreadSanitizer is not run on the system tests, and what would make
# it sound. Debian's Abseil is not built with -fsanitize=thread, so TSan
# does not see absl::Mutex lock and unlock: a counter guarded by an
# absl::MutexLock (probe.cc:9) is reported as a race. Wrapping absl::Mutex
# Lock/Unlock at link time (absl_mutex_wrap.cc, ld --wrap) and annotating
# them with the __tsan_mutex_* interface removes that false report, and the
# deliberately injected race (probe.cc:10) is still caught. Prints one line
# per build and run.
set -euo pipefail
cd "$(dirname "$0")"
out="${TMPDIR:-/tmp}/syncnorm-tsan-probe"
mkdir -p "$out"
libs="$(pkg-config --libs absl_synchronization)"
lock=_ZN4absl7debian35Mutex4LockEv
unlock=_ZN4absl7debian35Mutex6UnlockEv
clang++ -std=c++17 -O1 -g -fsanitize=thread probe.cc -o "$out/plain" $libs -lpthread
clang++ -std=c++17 -O1 -g -fsanitize=thread -Wl,--wrap=$lock -Wl,--wrap=$unlock \
  probe.cc absl_mutex_wrap.cc -o "$out/wrapped" $libs -lpthread
for b in plain wrapped; do
  for arg in "" race; do
    "$out/$b" $arg >/dev/null 2>"$out/log" && rc=0 || rc=$?
    echo "$b ${arg:-no-race}: exit $rc, $(grep -c 'WARNING: ThreadSanitizer' "$out/log") report(s) at $(grep -o 'probe.cc:[0-9]*' "$out/log" | sort -u | tr '\n' ' ')"
  done
done
