#!/usr/bin/env bash
# Builds the aggregator and the admin CLI for release (.bazelrc's
# --config=release: -c opt, NDEBUG, stripped) and stages them in OUT_DIR for
# the container image (deploy/Dockerfile): OUT_DIR/syncnorm-aggregator and
# OUT_DIR/syncnormctl (for `kubectl exec ... -- syncnormctl`). Checks that
# every shared library they link comes from a package listed in
# deploy/runtime-packages.txt, that the aggregator accepts the manifests'
# flags (deploy/base/aggregator.flags) in --check_config mode, and that
# each --version is VERSION's and not a development build's (no NDEBUG).
#
#   bash scripts/build-release.sh OUT_DIR
#
# SYNCNORM_BAZEL names the bazel command (deploy:release_test sets a
# stand-in that hands over the binary it already built).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUT_DIR}
bazel=${SYNCNORM_BAZEL:-bazel}

"$bazel" build --config=release //server:syncnorm-aggregator //client/ctl:syncnormctl
bin="$("$bazel" info --config=release bazel-bin)"
mkdir -p "$out"
install -m 0755 "$bin/server/syncnorm-aggregator" "$out/syncnorm-aggregator"
install -m 0755 "$bin/client/ctl/syncnormctl" "$out/syncnormctl"
binaries=("$out/syncnorm-aggregator" "$out/syncnormctl")

# The Debian package of each library the binaries name (DT_NEEDED); what
# those libraries need in turn, apt brings as their packages' dependencies.
# One dpkg -S for all (it is slow); dpkg knows merged-/usr files under
# either path.
declare -A lib_path pkg_of
while read -r name _ path _; do
  lib_path[$name]=$(readlink -f "$path")
done < <(for b in "${binaries[@]}"; do ldd "$b"; done |
  awk '$2 == "=>" && $3 ~ /^\//')
candidates=()
for p in "${lib_path[@]}"; do candidates+=("$p" "${p#/usr}"); done
# Lines are "pkg[:arch][, pkg...]: /path".
while read -r pkg path; do
  pkg_of[$path]=$pkg
done < <(dpkg -S "${candidates[@]}" 2>/dev/null |
  awk -F': ' '{split($1, p, ", "); sub(/:.*/, "", p[1]); print p[1], $2}')
missing=()
for name in $(for b in "${binaries[@]}"; do objdump -p "$b"; done |
  awk '$1 == "NEEDED" {print $2}' | sort -u); do
  case "$name" in ld-linux*) continue ;; esac  # the loader, in libc6
  path=${lib_path[$name]:-}
  [ -n "$path" ] || { missing+=("$name (not found by ldd)"); continue; }
  pkg=${pkg_of[$path]:-${pkg_of[${path#/usr}]:-}}
  case "$pkg" in
    libc6 | libstdc++6 | libgcc-s1 | zlib1g) ;;  # in debian:bookworm-slim
    "") missing+=("$name (no Debian package)") ;;
    *) grep -qx "$pkg" deploy/runtime-packages.txt || missing+=("$name ($pkg)") ;;
  esac
done
if ((${#missing[@]})); then
  echo "build-release: not in deploy/runtime-packages.txt: ${missing[*]}" >&2
  exit 1
fi

check_dir=$(mktemp -d)
trap 'rm -rf "$check_dir"' EXIT
"$out/syncnorm-aggregator" --check_config \
  --flagfile=deploy/base/aggregator.flags --listen=0.0.0.0:50051 \
  --data_dir="$check_dir/data"

for name in syncnormctl syncnorm-aggregator; do
  version="$name $(tr -d ' \n' <VERSION)"
  got=$("$out/$name" --version)
  if [ "$got" != "$version" ]; then
    echo "build-release: $out/$name --version says" >&2
    echo "$got" >&2
    echo "build-release: not '$version' alone: not a release build of this tree" >&2
    exit 1
  fi
  echo "build-release: $out/$name ($version)"
done
