#!/usr/bin/env bash
# scripts/build-release.sh, the build step of deploy/Dockerfile, with a
# stand-in for bazel that hands it the binary this test depends on: it
# stages the binary, finds every linked library in
# deploy/runtime-packages.txt, and runs --check_config with the manifests'
# flags. A runtime package list that lacks a linked library fails it.
set -euo pipefail

tree="${TEST_TMPDIR:?}/tree"
mkdir -p "$tree"
cp -rL scripts deploy server "$tree/"
cat >"$tree/fake-bazel" <<STUB
#!/usr/bin/env bash
case "\$1" in
  build) echo "fake bazel: build \${*:2}" >&2 ;;
  info) echo "$tree" ;;
  *) exit 2 ;;
esac
STUB
chmod +x "$tree/fake-bazel"

SYNCNORM_BAZEL="$tree/fake-bazel" bash "$tree/scripts/build-release.sh" \
  "$TEST_TMPDIR/out"
test -x "$TEST_TMPDIR/out/syncnorm-aggregator"
cmp server/syncnorm-aggregator "$TEST_TMPDIR/out/syncnorm-aggregator"

# Without libgrpc29 in the list, the script must refuse.
grep -vx 'libgrpc29' deploy/runtime-packages.txt \
  >"$tree/deploy/runtime-packages.txt"
if SYNCNORM_BAZEL="$tree/fake-bazel" bash "$tree/scripts/build-release.sh" \
  "$TEST_TMPDIR/out2" 2>"$TEST_TMPDIR/err"; then
  echo "FAIL: build-release.sh accepted a list without libgrpc29" >&2
  exit 1
fi
grep -q 'libgrpc29' "$TEST_TMPDIR/err"
echo "release: staged, runtime packages complete, flags accepted"
