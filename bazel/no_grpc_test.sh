#!/usr/bin/env bash
# no_grpc_test (bazel/no_grpc.bzl): fails when the query output $1, the
# labels of deps($2), names gRPC's libraries or a generated gRPC service.
set -euo pipefail
deps="$1"
target="$2"
if ! grep -qxF "$target" "$deps"; then
  echo "FAIL: the query of deps($target) does not name $target" >&2
  exit 1
fi
# The system library (grpc++ and grpc by pkg-config), the stubs' libraries
# (cc_grpc_library: aggregator_cc_grpc, its *_gen genrule), their generated
# files and the plugin that writes them.
pattern='^@syncnorm_system//:grpc$|_cc_grpc$|_cc_grpc_gen$|\.grpc\.pb\.(h|cc)$|grpc_cpp_plugin|grpcpp'
if found=$(grep -E "$pattern" "$deps"); then
  echo "FAIL: deps($target) holds gRPC:" >&2
  echo "$found" >&2
  exit 1
fi
echo "deps($target): $(wc -l <"$deps") targets, no gRPC"
