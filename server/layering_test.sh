#!/usr/bin/env bash
# layering_test.sh PACKAGE DEPS REGEX...: fails when DEPS (the dependency
# closure of PACKAGE's targets, one label a line, as //server:layering.bzl's
# query writes it) holds a label that one of the extended regular
# expressions matches in whole, naming each such label. An empty closure,
# or one without PACKAGE's own targets, fails too: the query did not run.
set -euo pipefail
package="$1"
deps="$2"
shift 2
if ! grep -q "^${package}:" "$deps"; then
  echo "layering_test: $deps holds no target of $package" >&2
  exit 1
fi
found=0
for pattern in "$@"; do
  if hits=$(grep -xE -- "$pattern" "$deps"); then
    echo "$package depends on what it must not ($pattern):" >&2
    echo "$hits" | sed 's/^/  /' >&2
    found=1
  fi
done
if [ "$found" -ne 0 ]; then
  echo "see: bazel query 'somepath(${package}:all, LABEL)'" >&2
  exit 1
fi
echo "layering_test: $(wc -l <"$deps") labels under $package, none forbidden"
