#!/usr/bin/env bash
# syncnorm-aggregator's command line as a user meets it. The list of flags
# --help must show comes from Abseil's own --helpfull (every flag linked in,
# by the file that defines it), less Abseil's built-in ones.
set -euo pipefail
bin=server/syncnorm-aggregator
version=$(tr -d ' \n' <VERSION)
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

for arg in --help -h; do
  out=$("$bin" "$arg" 2>"$TEST_TMPDIR/err") || fail "$arg exited $?"
  [ ! -s "$TEST_TMPDIR/err" ] || fail "$arg wrote to stderr: $(cat "$TEST_TMPDIR/err")"
  head -1 <<<"$out" | grep -qx 'Usage: syncnorm-aggregator \[--flag=value \.\.\.\]' ||
    fail "$arg: no usage line first: $(head -1 <<<"$out")"
  if grep -qi 'warning\|SetProgramUsageMessage' <<<"$out"; then
    fail "$arg: $(grep -i 'warning\|SetProgramUsageMessage' <<<"$out")"
  fi
done

# Abseil lists "Flags from FILE:" then "    --name (help...". Those of files
# outside absl/ are the program's own.
"$bin" --helpfull >"$TEST_TMPDIR/helpfull" 2>&1 || true
awk '/^  Flags from /{own = ($3 !~ /absl\//)} own && /^    --/{sub(/^    --/, ""); sub(/ .*/, ""); print}' \
  "$TEST_TMPDIR/helpfull" | sort >"$TEST_TMPDIR/expected"
[ "$(wc -l <"$TEST_TMPDIR/expected")" -ge 20 ] ||
  fail "read only $(wc -l <"$TEST_TMPDIR/expected") flags from --helpfull"
# --help also names Abseil's --flagfile, which the deployment uses.
"$bin" --help | sed -n 's/^  --\([a-z_0-9]*\)=.*/\1/p' | grep -vx flagfile |
  sort >"$TEST_TMPDIR/listed"
diff "$TEST_TMPDIR/expected" "$TEST_TMPDIR/listed" ||
  fail "--help does not list exactly the aggregator's flags (< missing, > extra)"
for flag in listen data_dir max_message_bytes check_config; do
  grep -q "^  --$flag=" <<<"$("$bin" --help)" || fail "--help lacks --$flag"
done
grep -q '^  --listen=127.0.0.1:50051$' <<<"$("$bin" --help)" || fail "--listen's default"

out=$("$bin" --version) || fail "--version exited $?"
[ "$(head -1 <<<"$out")" = "syncnorm-aggregator $version" ] ||
  fail "--version: '$(head -1 <<<"$out")', VERSION says $version"
lines=$(wc -l <<<"$out")
if [ "$lines" -eq 2 ]; then
  tail -1 <<<"$out" | grep -q '^development build' || fail "--version: $out"
elif [ "$lines" -ne 1 ]; then
  fail "--version: $out"
fi

# "--flag value" as well as "--flag=value".
out=$("$bin" --check_config --listen 127.0.0.1:0 --data_dir "" \
  --round_timeout_ms 1234 2>/dev/null) || fail "--flag value: exit $?"
grep -q 'listen=127.0.0.1:0 round_timeout_ms=1234' <<<"$out" ||
  fail "--flag value not taken: $out"
# An unknown flag is still an error.
if "$bin" --check_config --no_such_flag=1 >/dev/null 2>&1; then
  fail "--no_such_flag accepted"
fi
echo "aggregator command line: ok"
