#!/usr/bin/env bash
# Server reflection through a generic client (`buf curl`, npm @bufbuild/buf,
# installed by scripts/deps.sh), against the aggregator binary with metrics
# on, as deployed: it lists the services, lists every service's methods
# (which resolves each service's descriptor through reflection), checks
# and watches health and runs a round with request and response types
# taken from reflection alone; the server must stay up and SERVING
# throughout, and the round's answer must be the one a float64 computation
# gives.
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
checkout=$(cd "$(dirname "$self")/../.." && pwd)
buf="$checkout/tools/node/node_modules/.bin/buf"
if [ ! -x "$buf" ]; then
  echo "FAIL: $buf is missing: run scripts/deps.sh" >&2
  exit 1
fi
cd "${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:?}"
export HOME="${TEST_TMPDIR:?}" BUF_CACHE_DIR="${TEST_TMPDIR}/buf-cache"
dir=$(mktemp -d "${TEST_TMPDIR}/reflection.XXXXXX")

server/syncnorm-aggregator --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --data_dir= --port_file="$dir/port" 2>"$dir/aggregator.log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  [ -s "$dir/port" ] && break
  sleep 0.05
done
port=$(cat "$dir/port")
url="http://127.0.0.1:$port"
metrics_port=$(grep -o 'metrics_port=[0-9]*' "$dir/aggregator.log" | cut -d= -f2)

fail() {
  echo "FAIL: $*" >&2
  echo "--- aggregator log:" >&2
  cat "$dir/aggregator.log" >&2
  exit 1
}
alive() {
  kill -0 $pid 2>/dev/null || fail "the aggregator died ($1)"
}
bufcurl() {
  timeout 60 "$buf" curl --protocol grpc --http2-prior-knowledge "$@"
}

services=$(bufcurl --list-services "$url") || fail "--list-services failed"
alive "after --list-services"
expected_services="grpc.health.v1.Health
grpc.reflection.v1alpha.ServerReflection
syncnorm.v1.Aggregator"
[ "$services" = "$expected_services" ] ||
  fail "services: got '$services', want '$expected_services'"

# Every service's methods: buf resolves each service's descriptor through
# reflection to list them.
listed=$(bufcurl --list-methods "$url") || fail "--list-methods failed"
alive "after --list-methods"
expected_methods=""
for m in Health/Check Health/Watch; do
  expected_methods+="grpc.health.v1.$m"$'\n'
done
expected_methods+="grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"$'\n'
# The contract's methods, read from its .proto (not from the server).
for m in $(sed -n 's/^ *rpc \([A-Za-z0-9_]*\)(.*/\1/p' \
  proto/syncnorm/v1/aggregator.proto | LC_ALL=C sort); do
  expected_methods+="syncnorm.v1.Aggregator/$m"$'\n'
done
[ "$(grep -c 'syncnorm.v1.Aggregator/' <<<"$expected_methods")" -ge 10 ] ||
  fail "read too few methods from aggregator.proto: $expected_methods"
[ "$listed" = "${expected_methods%$'\n'}" ] ||
  fail "methods: got '$listed', want '${expected_methods%$'\n'}'"

# And each service described by the reflection service itself: the file
# that defines it, not an error.
for service in $services; do
  described=$(bufcurl -d "{\"file_containing_symbol\": \"$service\"}" \
    "$url/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") ||
    fail "describing $service failed"
  alive "after describing $service"
  echo "$described" | grep -q '"fileDescriptorResponse"' ||
    fail "describing $service: $described"
done

health=$(bufcurl "$url/grpc.health.v1.Health/Check") || fail "health check failed"
echo "$health" | grep -q '"status": "SERVING"' || fail "health: $health"

# A round of one rank: the global moments are its own, var = m2 / count.
bufcurl -d '{"job_id": "reflected", "world_size": 1, "layers": [{"name": "bn", "num_features": 2}]}' \
  "$url/syncnorm.v1.Aggregator/CreateJob" >/dev/null || fail "CreateJob failed"
result=$(bufcurl -d '{"job_id": "reflected", "layer": 0, "step": 1, "phase": "FORWARD", "rank": 0,
  "moments": {"count": 4, "mean": [1.5, -2.0], "m2": [3.0, 8.0]}}' \
  "$url/syncnorm.v1.Aggregator/ReduceOnce") || fail "ReduceOnce failed"
echo "$result" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)["moments"]
want = {"count": 4, "mean": [1.5, -2.0], "var": [3.0 / 4, 8.0 / 4]}
got = {"count": int(r["count"]), "mean": r["mean"], "var": r["var"]}
if got != want:
    sys.exit("round: got %s, want %s" % (got, want))
' || fail "ReduceOnce answered $result"

# An elastic job through the generic client: created with ranks 0 and 2 of
# a world of 4, rank 1 joins from step 3 and rank 2 leaves from step 5; the
# history comes back in the JSON of UpdateMembership and GetJob, and a
# change for a step that is too early is a failed_precondition.
bufcurl -d '{"job_id": "elastic", "world_size": 4, "members": [0, 2],
  "layers": [{"name": "bn", "num_features": 2}]}' \
  "$url/syncnorm.v1.Aggregator/CreateJob" >/dev/null || fail "elastic CreateJob failed"
bufcurl -d '{"job_id": "elastic", "step": 3, "join": [1]}' \
  "$url/syncnorm.v1.Aggregator/UpdateMembership" >/dev/null ||
  fail "UpdateMembership (join) failed"
bufcurl -d '{"job_id": "elastic", "step": 5, "leave": [2]}' \
  "$url/syncnorm.v1.Aggregator/UpdateMembership" >/dev/null ||
  fail "UpdateMembership (leave) failed"
elastic=$(bufcurl -d '{"job_id": "elastic"}' "$url/syncnorm.v1.Aggregator/GetJob") ||
  fail "GetJob of the elastic job failed"
echo "$elastic" | /usr/bin/python3 -c '
import json, sys
m = json.load(sys.stdin)["membership"]
got = [(int(c.get("version", 0)), int(c.get("step", 0)), c.get("members", []))
       for c in m["history"]]
want = [(0, 0, [0, 2]), (1, 3, [0, 1, 2]), (2, 5, [0, 1])]
if got != want or int(m["version"]) != 2 or m["members"] != [0, 1]:
    sys.exit("membership: got %s, want %s" % (m, want))
' || fail "GetJob of the elastic job answered $elastic"
if early=$(bufcurl -d '{"job_id": "elastic", "step": 2, "leave": [0]}' \
  "$url/syncnorm.v1.Aggregator/UpdateMembership" 2>&1); then
  fail "a change before the latest one's step succeeded: $early"
fi
echo "$early" | grep -q '"code": "failed_precondition"' ||
  fail "a change before the latest one's step answered $early"

# An error reaches the generic client with its code and message. The server
# also sends them as google.rpc.Status details, which buf decodes and shows
# in place of grpc-status: details that did not decode, or said another
# code, would show here.
if missing=$(bufcurl -d '{"job_id": "absent"}' \
  "$url/syncnorm.v1.Aggregator/GetJob" 2>&1); then
  fail "GetJob of an absent job succeeded: $missing"
fi
echo "$missing" | /usr/bin/python3 -c '
import json, sys
e = json.load(sys.stdin)
if e.get("code") != "not_found" or "absent" not in e.get("message", ""):
    sys.exit("error: %s" % e)
' || fail "GetJob of an absent job answered $missing"
alive "after an error"

# The reflection calls are counted like any other.
metrics=$(curl -sf "http://127.0.0.1:$metrics_port/metrics") || fail "no /metrics"
echo "$metrics" | grep -q 'grpc_code="OK",grpc_method="ServerReflectionInfo"' ||
  fail "no reflection call in the metrics: $(echo "$metrics" | grep handled_total)"

# Health as gRPC's standard service answers it: each known service (the
# server, "", and syncnorm.v1.Aggregator) by name, NOT_FOUND for another;
# Watch writes the status at once and again when it changes, here to
# NOT_SERVING on SIGTERM, and then ends, so that it does not hold the
# shutdown up.
health=$(bufcurl -d '{"service": "syncnorm.v1.Aggregator"}' \
  "$url/grpc.health.v1.Health/Check") || fail "health check of the service failed"
echo "$health" | grep -q '"status": "SERVING"' || fail "service health: $health"
if unknown=$(bufcurl -d '{"service": "no.such.Service"}' \
  "$url/grpc.health.v1.Health/Check" 2>&1); then
  fail "health of an unknown service succeeded: $unknown"
fi
echo "$unknown" | grep -q '"code": "not_found"' || fail "unknown service's health: $unknown"
bufcurl -d '{}' "$url/grpc.health.v1.Health/Watch" >"$dir/watch.out" 2>"$dir/watch.err" &
watch=$!
for _ in $(seq 200); do
  grep -q '"status": "SERVING"' "$dir/watch.out" 2>/dev/null && break
  sleep 0.05
done
grep -q '"status": "SERVING"' "$dir/watch.out" ||
  fail "Watch wrote no SERVING: $(cat "$dir/watch.out" "$dir/watch.err")"

alive "at the end"
kill -TERM $pid
wait $pid || fail "exit code $? after SIGTERM"
trap - EXIT
if wait $watch; then
  fail "Watch ended OK at shutdown: $(cat "$dir/watch.out")"
fi
/usr/bin/python3 - "$dir/watch.out" <<'PY' || fail "Watch wrote $(cat "$dir/watch.out")"
import json, sys
text = open(sys.argv[1]).read()
decoder, at, statuses = json.JSONDecoder(), 0, []
while True:
    while at < len(text) and text[at].isspace():
        at += 1
    if at == len(text):
        break
    message, at = decoder.raw_decode(text, at)
    statuses.append(message.get("status", "UNKNOWN"))
if statuses != ["SERVING", "NOT_SERVING"]:
    sys.exit("statuses: %s" % statuses)
PY
grep -q '"code": "unavailable"' "$dir/watch.err" ||
  fail "Watch ended with $(cat "$dir/watch.err")"
echo "reflection: services and methods listed, health SERVING and watched, a round served"
