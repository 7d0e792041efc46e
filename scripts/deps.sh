#!/usr/bin/env bash
# Installs the Debian 12 packages syncnorm builds and tests with. Idempotent:
# packages already installed are not fetched again. Run as root.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java
  g++ pkg-config git ca-certificates
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libgtest-dev libgmock-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
