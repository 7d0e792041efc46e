#!/usr/bin/env bash
# The Python package as a user gets it, outside Bazel and offline:
#  1. an sdist made from this checkout (client/python/build_backend);
#  2. a copy of client/python alone fails to build, saying what to do;
#  3. `pip wheel` of the sdist (with pip's build isolation) builds the
#     release binaries in the unpacked sdist's own workspace;
#  4. `pip wheel ./client/python` from the checkout gives the same bytes;
#  5. the wheel installs with its torch extra into a fresh
#     `venv --system-site-packages` (numpy and torch from Debian);
#  6. from there, outside the checkout: the version everywhere is VERSION's
#     (the aggregator's a release build's), the metadata states the
#     platform and the Debian packages, the packaged syncnormctl talks to
#     the packaged aggregator, and client/python/examples/train_cnn.py
#     trains against the packaged aggregator.
# The builds share a disk cache of their own, so step 4 costs little, and
# are CPU-only (SYNCNORM_CUDA=0): nvcc names anonymous namespaces after the
# path it compiles in, so CUDA builds in two folders differ in those bytes.
# scripts/test.sh runs this after the other suites; about 4 minutes on 2
# cores, nearly all of it step 3's Bazel build.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
py=/usr/bin/python3
version=$(tr -d ' \n' <VERSION)
tmp=$(mktemp -d)
aggregator_pid=
cleanup() {
  [ -z "$aggregator_pid" ] || kill "$aggregator_pid" 2>/dev/null || true
  chmod -R u+w "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "wheel_test: FAIL: $*" >&2
  exit 1
}
step() { echo "wheel_test: $* ($SECONDS s)"; }
export SYNCNORM_BAZEL_FLAGS="--disk_cache=$tmp/bazel-cache"
export SYNCNORM_CUDA=0

step "1. sdist"
"$py" client/python/build_backend/syncnorm_build.py sdist "$tmp/sdist" >/dev/null
sdist="$tmp/sdist/syncnorm-$version.tar.gz"
[ -f "$sdist" ] || fail "no $sdist"

step "2. a copy of client/python alone"
cp -r client/python "$tmp/copy"
if "$py" -m pip wheel --no-index --no-deps -w "$tmp/copy-wheel" "$tmp/copy" \
  >"$tmp/copy.log" 2>&1; then
  fail "a copy of client/python built a wheel without C++ sources"
fi
grep -q "no syncnorm C++ sources" "$tmp/copy.log" &&
  grep -q "sdist DIR" "$tmp/copy.log" ||
  fail "a copy of client/python: no clear message: $(tail -5 "$tmp/copy.log")"

step "3. pip wheel of the sdist"
(cd "$tmp" && "$py" -m pip wheel --no-index --no-deps -w "$tmp/wheels" \
  "$sdist") >"$tmp/sdist-wheel.log" 2>&1 ||
  fail "pip wheel of the sdist: $(tail -30 "$tmp/sdist-wheel.log")"
wheel=$(ls "$tmp"/wheels/syncnorm-"$version"-cp311-cp311-linux_x86_64.whl)

step "4. pip wheel from the checkout"
"$py" -m pip wheel --no-index --no-deps -w "$tmp/checkout-wheels" \
  ./client/python >"$tmp/checkout-wheel.log" 2>&1 ||
  fail "pip wheel ./client/python: $(tail -30 "$tmp/checkout-wheel.log")"
cmp "$wheel" "$tmp/checkout-wheels/$(basename "$wheel")" ||
  fail "the checkout's wheel differs from the sdist's"

step "5. install into a fresh venv"
"$py" -m venv --system-site-packages "$tmp/venv"
venv="$tmp/venv"
"$venv/bin/pip" install --no-index "$wheel[torch]" >"$tmp/install.log" 2>&1 ||
  fail "pip install: $(cat "$tmp/install.log")"

step "6. use it outside the checkout"
mkdir "$tmp/outside"
cd "$tmp/outside"
got=$("$venv/bin/syncnorm-aggregator" --version)
[ "$got" = "syncnorm-aggregator $version" ] ||
  fail "syncnorm-aggregator --version: '$got' (want the release build of $version)"
got=$("$venv/bin/python" -m syncnorm.aggregator --version)
[ "$got" = "syncnorm-aggregator $version" ] ||
  fail "python -m syncnorm.aggregator --version: '$got'"
got=$("$venv/bin/python" -c 'import syncnorm, syncnorm.torch; print(syncnorm.__version__, syncnorm.__file__)')
[ "${got%% *}" = "$version" ] || fail "syncnorm.__version__: $got"
case "${got#* }" in
  "$venv"/*) ;;
  *) fail "imported syncnorm from ${got#* }, not the venv" ;;
esac
"$venv/bin/python" - <<'EOF' || fail "the wheel's metadata"
from importlib import metadata
md = metadata.metadata("syncnorm")
assert "numpy" in md.get_all("Requires-Dist"), md.get_all("Requires-Dist")
assert 'torch; extra == "torch"' in md.get_all("Requires-Dist")
assert "Debian 12" in md["Supported-Platform"], md["Supported-Platform"]
external = md.get_all("Requires-External") or []
assert "libgrpc++1.51" in external and "librocksdb7.8" in external, external
EOF

# The packaged syncnormctl against the packaged aggregator.
"$venv/bin/syncnorm-aggregator" --listen=127.0.0.1:0 --data_dir= \
  --port_file="$tmp/port" 2>"$tmp/aggregator.log" &
aggregator_pid=$!
for _ in $(seq 300); do
  [ -s "$tmp/port" ] && break
  sleep 0.1
done
[ -s "$tmp/port" ] || fail "the packaged aggregator did not start: $(cat "$tmp/aggregator.log")"
"$venv/bin/syncnormctl" --server="127.0.0.1:$(cat "$tmp/port")" jobs \
  >"$tmp/jobs.log" 2>&1 || fail "syncnormctl jobs: $(cat "$tmp/jobs.log")"
kill -TERM "$aggregator_pid"
wait "$aggregator_pid" || fail "the aggregator's exit after SIGTERM: $?"
aggregator_pid=

# The example, copied out of the checkout: only the package can provide
# its aggregator and the syncnorm module. Its processes are started with
# torchrun's variables set by the example itself (--launcher=env), one
# moving part fewer than torchrun's rendezvous; //client/python:example_test
# runs it under torchrun too.
cp "$repo/client/python/examples/train_cnn.py" "$tmp/outside/"
env -u RUNFILES_DIR -u PYTHON_RUNFILES -u SYNCNORM_AGGREGATOR -u PYTHONPATH \
  timeout 300 "$venv/bin/python" train_cnn.py --launcher=env --workers=2 \
  --steps=20 --log_every=10 >"$tmp/example.log" 2>&1 ||
  fail "the example: $(tail -20 "$tmp/example.log")"
cat "$tmp/example.log"
# Under torchrun (the example's default launcher) rank 0's lines carry
# its "[default0]:" prefix.
diff=$(sed -n 's/^\(\[[a-z0-9]*\]:\)\{0,1\}done: .*max |diff| \([0-9.e+-]*\).*/\2/p' \
  "$tmp/example.log")
[ -n "$diff" ] || fail "the example printed no final line"
"$py" -c "import sys; sys.exit(0 if float('$diff') <= 1e-5 else 1)" ||
  fail "the example's running statistics differ from the aggregator's by $diff"
step "passed"
