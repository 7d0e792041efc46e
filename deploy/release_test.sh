#!/usr/bin/env bash
# scripts/build-release.sh, the build step of deploy/Dockerfile, with a
# stand-in for bazel that records its arguments and hands it the binaries
# this test depends on: it must ask for the release configuration, stage
# the aggregator and syncnormctl, find every linked library in
# deploy/runtime-packages.txt, run --check_config with the manifests'
# flags, and refuse the aggregator in the end: it is the test
# configuration's, a development build (no NDEBUG). A runtime package list
# that lacks a linked library fails it earlier.
set -euo pipefail

tree="${TEST_TMPDIR:?}/tree"
mkdir -p "$tree"
cp -rL scripts deploy server client VERSION "$tree/"
cat >"$tree/fake-bazel" <<STUB
#!/usr/bin/env bash
echo "\$*" >>"$tree/bazel-calls"
case "\$1" in
  build) echo "fake bazel: build \${*:2}" >&2 ;;
  info) echo "$tree" ;;
  *) exit 2 ;;
esac
STUB
chmod +x "$tree/fake-bazel"

if SYNCNORM_BAZEL="$tree/fake-bazel" bash "$tree/scripts/build-release.sh" \
  "$TEST_TMPDIR/out" >"$TEST_TMPDIR/log" 2>&1; then
  cat "$TEST_TMPDIR/log" >&2
  echo "FAIL: build-release.sh accepted a development build" >&2
  exit 1
fi
cat "$TEST_TMPDIR/log"
grep -qx 'build --config=release //server:syncnorm-aggregator //client/ctl:syncnormctl' \
  "$tree/bazel-calls"
grep -qx 'info --config=release bazel-bin' "$tree/bazel-calls"
test -x "$TEST_TMPDIR/out/syncnorm-aggregator"
cmp server/syncnorm-aggregator "$TEST_TMPDIR/out/syncnorm-aggregator"
cmp client/ctl/syncnormctl "$TEST_TMPDIR/out/syncnormctl"
grep -q "build-release: $TEST_TMPDIR/out/syncnormctl (syncnormctl " "$TEST_TMPDIR/log"
grep -q 'config ok: listen=0.0.0.0:50051' "$TEST_TMPDIR/log"
grep -q "^development build" "$TEST_TMPDIR/log"
grep -q "not a release build" "$TEST_TMPDIR/log"

# Without libgrpc29 in the list, the script must refuse, naming it.
grep -vx 'libgrpc29' deploy/runtime-packages.txt \
  >"$tree/deploy/runtime-packages.txt"
if SYNCNORM_BAZEL="$tree/fake-bazel" bash "$tree/scripts/build-release.sh" \
  "$TEST_TMPDIR/out2" 2>"$TEST_TMPDIR/err"; then
  echo "FAIL: build-release.sh accepted a list without libgrpc29" >&2
  exit 1
fi
grep -q 'libgrpc29' "$TEST_TMPDIR/err"
echo "release: release config asked for, aggregator and syncnormctl staged," \
  "runtime packages complete, flags accepted, a development build refused"
