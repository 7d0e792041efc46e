#!/usr/bin/env bash
# syncnorm_relay's command line: --help lists its flags with their
# defaults, a bad option exits 2 naming the flag, a good one serves.
set -euo pipefail
bin=relay/syncnorm_relay
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

out=$("$bin" --help 2>"$TEST_TMPDIR/err") || fail "--help exited $?"
[ ! -s "$TEST_TMPDIR/err" ] || fail "--help wrote to stderr: $(cat "$TEST_TMPDIR/err")"
head -1 <<<"$out" | grep -q '^Usage: syncnorm_relay' || fail "no usage line: $(head -1 <<<"$out")"
for flag in listen=127.0.0.1:50061 upstream= block_positions=8 \
  upstream_token_file= tokens_file= job_refresh_ms=100 \
  pass_through_margin_ms=20 max_pending_blocks_per_job=4096 max_jobs=1024 \
  tls_cert= tls_key= tls_client_ca= allow_insecure=false upstream_tls=false \
  upstream_tls_root_ca= upstream_tls_client_cert= upstream_tls_client_key=; do
  grep -q "^  --$flag" <<<"$out" || fail "--help lacks --$flag"
done

set +e
"$bin" --upstream=127.0.0.1:1 --block_positions=6 2>"$TEST_TMPDIR/err"
code=$?
set -e
[ "$code" -eq 2 ] || fail "--block_positions=6 exited $code, not 2"
grep -q 'block_positions is 6' "$TEST_TMPDIR/err" || fail "$(cat "$TEST_TMPDIR/err")"

set +e
"$bin" 2>"$TEST_TMPDIR/err"
code=$?
set -e
[ "$code" -eq 2 ] || fail "no --upstream exited $code, not 2"
grep -q 'upstream' "$TEST_TMPDIR/err" || fail "$(cat "$TEST_TMPDIR/err")"

set +e
"$bin" --upstream=127.0.0.1:1 --upstream_token_file="$TEST_TMPDIR/none" 2>"$TEST_TMPDIR/err"
code=$?
set -e
[ "$code" -eq 2 ] || fail "a missing --upstream_token_file exited $code, not 2"
grep -q 'upstream_token_file' "$TEST_TMPDIR/err" || fail "$(cat "$TEST_TMPDIR/err")"

# TLS: each unreadable file and each half pair exits 2 naming its flag.
for args in "--tls_cert=$TEST_TMPDIR/none --tls_key=$TEST_TMPDIR/none:tls_cert" \
  "--tls_cert=$TEST_TMPDIR/none:tls_key" \
  "--upstream_tls_root_ca=$TEST_TMPDIR/none:upstream_tls_root_ca" \
  "--upstream_tls_client_cert=$TEST_TMPDIR/none:upstream_tls_client_key"; do
  set +e
  # shellcheck disable=SC2086
  "$bin" --upstream=127.0.0.1:1 --listen=127.0.0.1:0 ${args%:*} 2>"$TEST_TMPDIR/err"
  code=$?
  set -e
  [ "$code" -eq 2 ] || fail "${args%:*} exited $code, not 2"
  grep -q -- "--${args##*:}" "$TEST_TMPDIR/err" || fail "$(cat "$TEST_TMPDIR/err")"
done

# Serves, writes its port, and stops on SIGTERM with exit 0.
"$bin" --upstream=127.0.0.1:1 --listen=127.0.0.1:0 \
  --port_file="$TEST_TMPDIR/port" 2>"$TEST_TMPDIR/log" &
pid=$!
for _ in $(seq 100); do
  [ -s "$TEST_TMPDIR/port" ] && break
  sleep 0.05
done
[ -s "$TEST_TMPDIR/port" ] || fail "no port file: $(cat "$TEST_TMPDIR/log")"
kill -TERM "$pid"
wait "$pid" || fail "exited $? on SIGTERM"
grep -q 'event=relay_started' "$TEST_TMPDIR/log" || fail "$(cat "$TEST_TMPDIR/log")"
echo PASS
