#!/usr/bin/env bash
# deploy/local-cluster starts 2 shards with the StatefulSet's args, each
# answers SERVING on its own port, `syncnormctl backup` writes each shard's
# backup on its backup volume, one shard survives a kill -9 and comes back
# on its folder, and stop ends both within the grace period.
set -euo pipefail

binary="$PWD/server/syncnorm-aggregator"
ctl="$PWD/client/ctl/syncnormctl"
cluster="$PWD/deploy/local-cluster"
dir="${TEST_TMPDIR:?}/cluster"
trap '"$cluster" stop --dir="$dir" >/dev/null 2>&1 || true' EXIT

addresses=$("$cluster" start --dir="$dir" --shards=2 --base_port=0 \
  --binary="$binary")
echo "shards: $addresses"
[ "$(tr ',' '\n' <<<"$addresses" | sort -u | wc -l)" -eq 2 ]

"$cluster" status --dir="$dir" | tee "$TEST_TMPDIR/status"
[ "$(grep -c ' running SERVING$' "$TEST_TMPDIR/status")" -eq 2 ]

# Each shard runs with the StatefulSet's args, its paths under its folder.
for i in 0 1; do
  pid=$(node -e 'console.log(require(process.argv[1]).shards[process.argv[2]].pid)' \
    "$dir/cluster.json" "$i")
  args=$(tr '\0' ' ' <"/proc/$pid/cmdline")
  echo "shard $i: $args"
  grep -q -- "--flagfile=$dir/shard-$i/etc/syncnorm/config/aggregator.flags " <<<"$args"
  grep -q -- "--data_dir=$dir/shard-$i/var/lib/syncnorm/data" <<<"$args"
  grep -q -- "--backup_dir=$dir/shard-$i/var/lib/syncnorm-backup/backups" <<<"$args"
  grep -q -- "--listen=127.0.0.1:" <<<"$args"
  grep -q -- "--metrics_listen=127.0.0.1:" <<<"$args"
  [ "$(wc -w <<<"$args")" -eq 6 ]  # the binary and the five args
  # Each shard serves its Prometheus metrics on a loopback port of its own.
  metrics=$(node -e 'console.log(require(process.argv[1]).shards[process.argv[2]].metrics)' \
    "$dir/cluster.json" "$i")
  exec 3<>"/dev/tcp/${metrics%:*}/${metrics#*:}"
  printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
  grep -q '^grpc_server_handled_total{' <&3
  exec 3<&-
done
# The flags (not the comments, whose example paths are localized too).
diff <(grep -v "^\s*#" "$dir/shard-0/etc/syncnorm/config/aggregator.flags") \
  <(grep -v "^\s*#" deploy/base/aggregator.flags)

# A backup lands on each shard's backup volume, not on its data volume.
SYNCNORM_ADDRESS="$addresses" "$ctl" backup smoke
for i in 0 1; do
  [ -f "$dir/shard-$i/var/lib/syncnorm-backup/backups/smoke/shard-$i/SYNCNORM_BACKUP" ]
done
SYNCNORM_ADDRESS="$addresses" "$ctl" backups | grep -q '^smoke .* 2/2 '

"$cluster" restart --dir="$dir" --shard=1
"$cluster" status --dir="$dir" | tee "$TEST_TMPDIR/status"
[ "$(grep -c ' running SERVING$' "$TEST_TMPDIR/status")" -eq 2 ]

"$cluster" stop --dir="$dir"
trap - EXIT
if "$cluster" status --dir="$dir"; then
  echo "FAIL: shards still serving after stop" >&2
  exit 1
fi
echo "local-cluster: 2 shards started, restarted one, stopped"
