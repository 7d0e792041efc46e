#!/usr/bin/env bash
# syncnorm_relay's command line: --help lists its flags with their
# defaults; as the aggregator's, a bad option exits 2 naming the flag, a
# file that cannot be read fails the start (1) naming its flag, and
# --check_config reports either as 2 (0 and the settings when they are
# good); a good command line serves.
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
  upstream_tls_root_ca= upstream_tls_client_cert= upstream_tls_client_key= \
  max_message_bytes=4194304 max_streams=64 max_waiting_calls=32 \
  max_streams_per_connection=100 stream_idle_timeout_ms=300000 \
  max_transport_bytes=268435456 metrics_listen= check_config=false; do
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

# A file that cannot be read: the start fails (1), naming the flag; for
# --check_config it is a bad config (2).
for check in "" --check_config; do
  want=1
  [ -z "$check" ] || want=2
  set +e
  # shellcheck disable=SC2086
  "$bin" --upstream=127.0.0.1:1 --listen=127.0.0.1:0 $check \
    --upstream_token_file="$TEST_TMPDIR/none" 2>"$TEST_TMPDIR/err"
  code=$?
  set -e
  [ "$code" -eq "$want" ] || fail "a missing --upstream_token_file $check exited $code, not $want"
  grep -q 'upstream_token_file' "$TEST_TMPDIR/err" || fail "$(cat "$TEST_TMPDIR/err")"

  # TLS: each unreadable file exits $want, each half pair 2, naming its flag.
  for args in "--tls_cert=$TEST_TMPDIR/none --tls_key=$TEST_TMPDIR/none:tls_cert:$want" \
    "--tls_cert=$TEST_TMPDIR/none:tls_key:2" \
    "--upstream_tls_root_ca=$TEST_TMPDIR/none:upstream_tls_root_ca:$want" \
    "--upstream_tls_client_cert=$TEST_TMPDIR/none --upstream_tls_client_key=$TEST_TMPDIR/none:upstream_tls_client_cert:$want" \
    "--upstream_tls_client_cert=$TEST_TMPDIR/none:upstream_tls_client_key:2"; do
    flags=${args%%:*}
    rest=${args#*:}
    flag=${rest%%:*}
    expect=${rest##*:}
    set +e
    # shellcheck disable=SC2086
    "$bin" --upstream=127.0.0.1:1 --listen=127.0.0.1:0 $check $flags 2>"$TEST_TMPDIR/err"
    code=$?
    set -e
    [ "$code" -eq "$expect" ] || fail "$check $flags exited $code, not $expect"
    grep -q -- "--$flag" "$TEST_TMPDIR/err" || fail "$(cat "$TEST_TMPDIR/err")"
  done
done

# A transport quota below twice the message bound cannot work.
set +e
"$bin" --upstream=127.0.0.1:1 --max_message_bytes=1048576 \
  --max_transport_bytes=1048576 2>"$TEST_TMPDIR/err"
code=$?
set -e
[ "$code" -eq 2 ] || fail "--max_transport_bytes below the ceiling exited $code, not 2"
grep -q -- '--max_transport_bytes=1048576 is below twice --max_message_bytes' "$TEST_TMPDIR/err" ||
  fail "$(cat "$TEST_TMPDIR/err")"

# --check_config on a good command line: 0, the settings, nothing served.
out=$("$bin" --upstream=127.0.0.1:1 --listen=127.0.0.1:0 --check_config \
  --max_streams=16 2>"$TEST_TMPDIR/err") || fail "--check_config exited $?: $(cat "$TEST_TMPDIR/err")"
grep -q '^syncnorm_relay: config ok: .*max_streams=16 ' <<<"$out" || fail "--check_config printed: $out"

# Serves, writes its port, and stops on SIGTERM with exit 0.
"$bin" --upstream=127.0.0.1:1 --listen=127.0.0.1:0 \
  --metrics_listen=127.0.0.1:0 \
  --port_file="$TEST_TMPDIR/port" 2>"$TEST_TMPDIR/log" &
pid=$!
for _ in $(seq 100); do
  [ -s "$TEST_TMPDIR/port" ] && break
  sleep 0.05
done
[ -s "$TEST_TMPDIR/port" ] || fail "no port file: $(cat "$TEST_TMPDIR/log")"
kill -TERM "$pid"
wait "$pid" || fail "exited $? on SIGTERM"
grep -q 'event=relay_started .*metrics_port=[1-9]' "$TEST_TMPDIR/log" || fail "$(cat "$TEST_TMPDIR/log")"
echo PASS
