#!/usr/bin/env bash
# `buf lint` (npm @bufbuild/buf, installed by scripts/deps.sh) passes on
# proto/ as it is, with the rules of buf.yaml.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
checkout=$(cd "$(dirname "$self")/../.." && pwd)
buf="$checkout/tools/node/node_modules/.bin/buf"
if [ ! -x "$buf" ]; then
  echo "FAIL: $buf is missing: run scripts/deps.sh" >&2
  exit 1
fi

# buf.yaml and proto/ as declared inputs, in this test's runfiles.
cd "${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:?}"
export BUF_CACHE_DIR="${TEST_TMPDIR:?}/buf-cache"
export HOME="${TEST_TMPDIR}"
"$buf" --version
"$buf" lint
echo "buf lint: proto/ passes"
