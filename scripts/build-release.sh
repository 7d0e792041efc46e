#!/usr/bin/env bash
# Builds the aggregator for release (.bazelrc's --config=release: -c opt,
# NDEBUG, stripped) and stages it in OUT_DIR for the container image
# (deploy/Dockerfile): OUT_DIR/syncnorm-aggregator. Checks that every
# shared library it links comes from a package listed in
# deploy/runtime-packages.txt, that it accepts the manifests' flags
# (deploy/base/aggregator.flags) in --check_config mode, and that its
# --version is VERSION's and not a development build's (no NDEBUG).
#
#   bash scripts/build-release.sh OUT_DIR
#
# SYNCNORM_BAZEL names the bazel command (deploy:release_test sets a
# stand-in that hands over the binary it already built).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUT_DIR}
bazel=${SYNCNORM_BAZEL:-bazel}
target=//server:syncnorm-aggregator

"$bazel" build --config=release "$target"
binary="$("$bazel" info --config=release bazel-bin)/server/syncnorm-aggregator"
mkdir -p "$out"
install -m 0755 "$binary" "$out/syncnorm-aggregator"

# The Debian package of each library the binary names (DT_NEEDED); what
# those libraries need in turn, apt brings as their packages' dependencies.
# One dpkg -S for all (it is slow); dpkg knows merged-/usr files under
# either path.
declare -A lib_path pkg_of
while read -r name _ path _; do
  lib_path[$name]=$(readlink -f "$path")
done < <(ldd "$out/syncnorm-aggregator" | awk '$2 == "=>" && $3 ~ /^\//')
candidates=()
for p in "${lib_path[@]}"; do candidates+=("$p" "${p#/usr}"); done
# Lines are "pkg[:arch][, pkg...]: /path".
while read -r pkg path; do
  pkg_of[$path]=$pkg
done < <(dpkg -S "${candidates[@]}" 2>/dev/null |
  awk -F': ' '{split($1, p, ", "); sub(/:.*/, "", p[1]); print p[1], $2}')
missing=()
for name in $(objdump -p "$out/syncnorm-aggregator" | awk '$1 == "NEEDED" {print $2}'); do
  path=${lib_path[$name]:-}
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

version="syncnorm-aggregator $(tr -d ' \n' <VERSION)"
got=$("$out/syncnorm-aggregator" --version)
if [ "$got" != "$version" ]; then
  echo "build-release: $out/syncnorm-aggregator --version says" >&2
  echo "$got" >&2
  echo "build-release: not '$version' alone: not a release build of this tree" >&2
  exit 1
fi
echo "build-release: $out/syncnorm-aggregator ($version)"
