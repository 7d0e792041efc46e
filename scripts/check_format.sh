#!/usr/bin/env bash
# Fails, naming each line, when clang-format-14 (with the repository's
# .clang-format: Google style) would change a tracked C++ or CUDA file.
# Fix: clang-format-14 -i FILE.
set -uo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
out=$(echo "$files" | xargs clang-format-14 --dry-run 2>&1)
if [ -n "$out" ]; then
  echo "$out"
  echo "clang-format-14 would change $(grep -c 'warning:' <<<"$out") line(s);" \
    "run: clang-format-14 -i FILE" >&2
  exit 1
fi
echo "format: $(echo "$files" | wc -l) C++/CUDA files as clang-format-14 writes them"
