#!/usr/bin/env bash
# Builds and tests examples/bazel_consumer, a workspace of its own that
# depends on this checkout as docs/bazel.md, "Using syncnorm from your Bazel
# workspace", says (local_repository + syncnorm_dependencies(), CPU only).
# Its "//target STATUS" lines are printed prefixed with "consumer ";
# scripts/test.sh runs this after the main suite and counts them. Its Bazel
# server is stopped afterwards (it holds a JVM's memory). Extra arguments
# go to its `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/../examples/bazel_consumer"
start=$SECONDS
bazel test //... "$@" 2>&1 | sed "s|^//|consumer //|"
rc=${PIPESTATUS[0]}
bazel shutdown
echo "examples/bazel_consumer: $((SECONDS - start)) s"
exit "$rc"
