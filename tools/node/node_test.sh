#!/usr/bin/env bash
# Runs a Node.js test under `bazel test`: node FILE.js ARGS..., with the
# workspace's runfiles as the working folder and NODE_PATH at the modules
# that scripts/deps.sh installed in tools/node/node_modules.
#
# The modules are not Bazel inputs (the build is offline), so they are found
# in the real checkout: this script's runfile is a symlink into it. Tests
# that use this declare //tools/node:package-lock.json as data so that a
# change of versions reruns them.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
checkout=$(cd "$(dirname "$self")/../.." && pwd)
modules="$checkout/tools/node/node_modules"
lock="$checkout/tools/node/package-lock.json"
stamp="$modules/.syncnorm-lock-sha256"
if [ ! -d "$modules" ]; then
  echo "FAIL: $modules is missing: run scripts/deps.sh" >&2
  exit 1
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$(sha256sum "$lock" | cut -d' ' -f1)" ]; then
  echo "FAIL: $modules does not match package-lock.json: run scripts/deps.sh" >&2
  exit 1
fi
if ! command -v node >/dev/null; then
  echo "FAIL: node is not installed: run scripts/deps.sh" >&2
  exit 1
fi

cd "${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:?}"
export NODE_PATH="$modules"
export SYNCNORM_CHECKOUT="$checkout"
exec node "$@"
