#!/usr/bin/env bash
# Installs the Debian 12 packages syncnorm builds and tests with, then the
# Node.js tools of the test suite (tools/node/, pinned by its
# package-lock.json: manifest checks, the gRPC interop client, buf lint).
# Idempotent: packages already installed are not fetched again, and npm runs
# only when tools/node/node_modules is missing or the lock file changed.
# Run as root. `--build-only` installs just what building the server needs
# (the container recipe, deploy/Dockerfile, uses that).
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    *) echo "usage: $0 [--build-only]" >&2; exit 2 ;;
  esac
done

PACKAGES=(
  bazel-bootstrap bazel-rules-java
  g++ pkg-config git ca-certificates
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libgtest-dev libgmock-dev
  librocksdb-dev nlohmann-json3-dev
  prometheus-cpp-dev
)
if ((!build_only)) && ! command -v node >/dev/null; then
  PACKAGES+=(nodejs npm)
fi
# The references of the benchmarks (bench/): torch.distributed's gloo
# collectives and torch's CPU batch norm.
if ((!build_only)); then
  PACKAGES+=(python3-torch python3-numpy)
fi
# The Python package (client/python): CPython and pybind11 headers for the
# extension, pip for `pip install ./client/python`, venv for
# scripts/wheel_test.sh's fresh environment; its tests use python3-torch and
# python3-numpy (above), and export_test reads torch.onnx.export's models
# with python3-onnx.
if ((!build_only)); then
  PACKAGES+=(python3-dev pybind11-dev python3-pip python3-venv python3-onnx)
fi
# The metrics test (tests/metrics_test.cc) scrapes the aggregator with a
# real Prometheus server and reads the answers from its HTTP API; the
# reflection test (tests/interop/reflection_test.sh) fetches /metrics with
# curl.
if ((!build_only)); then
  PACKAGES+=(prometheus curl)
fi
# The security tests (tests/security_test.cc) make their CA and
# certificates at test time with the openssl CLI; no key is committed.
if ((!build_only)); then
  PACKAGES+=(openssl)
fi

# Debian's clang 14: the fuzz test (tests/fuzz/run_fuzz.sh, libFuzzer),
# the build that checks the locking annotations (--config=thread-safety)
# and the format check (scripts/check_format.sh, clang-format-14).
if ((!build_only)); then
  PACKAGES+=(clang libclang-rt-14-dev clang-format)
fi

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

if ((!build_only)); then
  lock_sum=$(sha256sum tools/node/package-lock.json | cut -d' ' -f1)
  stamp=tools/node/node_modules/.syncnorm-lock-sha256
  if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
    echo "installing Node.js tools (npm ci in tools/node)" >&2
    npm ci --prefix tools/node --no-audit --no-fund --loglevel=error >/dev/null
    echo "$lock_sum" >"$stamp"
  fi
fi
