"""Many ranks (issue 35, item 1): W ranks of one job, each with its own TCP
connection and Reduce stream (bench-wide-client, one process), against
syncnorm's aggregator (durable, as the other benchmarks run it) and, in the
same run and under the same client, the floor: bench-server --floor, the
least syncnorm.v1.Aggregator (gather, rank-order merge, answer; no store,
validation or metrics).

For each W x L layers x C channels x mode (lockstep: one contribution in
flight per stream; pipelined: the L layers of a step in flight), both
servers are started fresh and measured over the same measured rounds:
  round time       first rank's send to last rank's answer, p50 / p99
  completion time  last rank's send to last rank's answer, p50 / p99
  server and client CPU per contribution (/proc utime + stime over the
                   measured rounds, divided by W x rounds)
  server RSS per rank: VmRSS after the rounds (streams still open) minus
                   VmRSS before the client connected, divided by W
  server minor page faults per contribution.
  server idle CPU: its CPU share of a core over 1 s before the client
                   starts; relayed rows also show the shard's CPU net of
                   it, which otherwise dominates a shard behind relays.
With --relays R, each configuration also runs through R relays
(relay/syncnorm_relay, blocks of --relay_block positions) in front of a
fresh syncnorm server: its rows ("relayed") carry the shard's CPU and the
relays' CPU, each per rank's contribution. With --relay_parents B2,B3,...
the relays form a tree: above the R relays, one relay of blocks of B2
positions takes their blocks (--parent_relay), one of B3 above it, and
so on; the top one sends to the shard.
Every answer is checked against the client's own float64 merge; any error
fails the run. Rows go to --json as JSON lines (one per server and
configuration) for the capacity model.

The kernel counts CPU time in 10 ms ticks: the default rounds give each
configuration 16,384 contributions or more (a few hundred ticks of server
CPU), and fewer rounds at large W (W = 4096: 4 rounds, p99 = the worst).
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

KEYS = ["server", "W", "L", "C", "mode", "rounds", "contributions", "seconds",
        "round_p50_ms", "round_p99_ms", "completion_p50_ms",
        "completion_p99_ms", "server_cpu_us_per_contribution",
        "client_cpu_us_per_contribution", "server_rss_bytes",
        "server_rss_base_bytes", "rss_per_rank_bytes",
        "minor_faults_per_contribution", "request_bytes", "answer_bytes"]

# A relayed row's: its relays, their block and their CPU (all of them) per
# rank's contribution. server_cpu_us_per_contribution stays the shard's,
# per rank's contribution too.
RELAY_KEYS = ["relays", "relay_block", "relay_parents",
              "relay_cpu_us_per_contribution", "server_idle_cpu_share",
              "server_net_cpu_us_per_contribution"]

# How long each server is watched idle before the client starts.
IDLE_SECONDS = 1.0

# Contributions measured per configuration unless --rounds says otherwise.
TARGET_CONTRIBUTIONS = 16384
# The per-rank allowance beside two payloads in the RSS comparison: what
# a connection and a stream hold whatever C is (fitted from C = 256 and
# 2048 when both run, printed beside it).
RSS_ALLOWANCE = 64 << 10


def proc_stat(pid):
    """(CPU seconds, minor faults) of process `pid` so far."""
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[7])


def threads_cpu_seconds(pid):
    """CPU seconds of process `pid`'s live threads, to the nanosecond
    (/proc schedstat; /proc stat counts 10 ms ticks)."""
    total = 0
    for task in os.listdir("/proc/%d/task" % pid):
        try:
            total += int(open("/proc/%d/task/%s/schedstat"
                              % (pid, task)).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def rss_bytes(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < need:
        sys.exit("bench: %d file descriptors needed, the hard limit is %d"
                 % (need, hard))


def start_server(kind, tmp, name):
    if kind == "floor":
        return common.Server("bench/bench-server", tmp, name, ["--floor"])
    # Durable (common.Server gives it a fresh --data_dir). W streams are
    # within the default --max_streams (10,000).
    return common.Server("server/syncnorm-aggregator", tmp, name)


def expect(client, line):
    """Reads client stdout up to `line` (a WINDOW_ line); False at its end."""
    while True:
        out = client.stdout.readline()
        if not out:
            return False
        if out.strip() == line:
            return True


RELAY_BINARY = "relay/syncnorm_relay"


def run_one(kind, w, layers, c, mode, rounds, tmp, index, relays=(0, 8, ())):
    """One configuration against a fresh server of `kind` (syncnorm, floor,
    or relayed: syncnorm behind relays[0] relays of blocks of relays[1]
    positions, under one relay each of the blocks in relays[2], bottom
    up): the JSON row, or None (the reason printed) when the client
    failed."""
    name = "%s-%d-%d-%d-%s" % (kind, w, layers, c, mode)
    server = start_server("syncnorm" if kind == "relayed" else kind, tmp, name)
    pid = server.proc.pid
    err_log = os.path.join(tmp, name + ".client.log")
    relay_procs, parent_procs = [], []
    try:
        if kind == "relayed":
            # Each relay serves whole blocks (a block split between relays
            # never completes at either, and goes through only at the round
            # timeout): the most relays, a power of two, up to relays[0]
            # and W / block.
            n = 1
            while n * 2 <= min(relays[0], w // relays[1]):
                n *= 2
            # The tree's upper levels, top first: each level's margin one
            # hop (20 ms) above the level over it (docs/relay.md).
            parent = []
            levels = len(relays[2])
            for level, block in enumerate(reversed(relays[2])):
                parent_procs.append(common.Server(
                    RELAY_BINARY, tmp,
                    "%s-parent%d" % (name, block),
                    ["--upstream=" + server.address,
                     "--block_positions=%d" % block,
                     "--pass_through_margin_ms=%d" % (20 * (level + 1)),
                     # Its children's blocks come as ReduceOnce calls,
                     # W / B of them a round (docs/relay.md, A parent's
                     # bounds).
                     "--max_waiting_calls=0"]
                    + parent, data_dir=False))
                parent = ["--parent_relay=" + parent_procs[-1].address]
            relay_procs = [
                common.Server(RELAY_BINARY, tmp,
                              "%s-relay%d" % (name, i),
                              ["--upstream=" + server.address,
                               "--block_positions=%d" % relays[1],
                               "--pass_through_margin_ms=%d"
                               % (20 * (levels + 1)),
                               # A relay here serves up to W / n ranks, far
                               # more than a deployed relay's block: its
                               # stream bound (64) would refuse them.
                               "--max_streams=0"] + parent,
                              data_dir=False)
                for i in range(n)]
        # The server's CPU while idle (its reaper, gRPC's timers), as a
        # share of a core: at a shard behind relays it is most of what the
        # rounds' window counts, so the relayed rows also show their CPU
        # net of it.
        idle0, idle_t0 = threads_cpu_seconds(pid), time.time()
        time.sleep(IDLE_SECONDS)
        idle_share = ((threads_cpu_seconds(pid) - idle0)
                      / (time.time() - idle_t0))
        base_rss = rss_bytes(pid)
        client = subprocess.Popen(
            [common.runfile("bench/bench-wide-client"),
             "--address=" + server.address, "--server=" + kind,
             "--relays=" + ",".join(r.address for r in relay_procs),
             "--job=wide-%d-%d" % (index, int(time.time())),
             "--mode=" + mode, "--world=%d" % w, "--layers=%d" % layers,
             "--channels=%d" % c, "--steps=%d" % (rounds // layers),
             "--warmup_steps=1", "--handshake"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(err_log, "w"), text=True)
        marks = []
        for line in ("WINDOW_BEGIN", "WINDOW_END"):
            if not expect(client, line):
                break
            marks.append(proc_stat(pid) + proc_stat(client.pid)[:1]
                         + (rss_bytes(pid),
                            sum(proc_stat(r.proc.pid)[0]
                                for r in relay_procs + parent_procs),
                            time.time()))
            client.stdin.write("\n")
            client.stdin.flush()
        try:
            out, _ = client.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            client.kill()
            out = ""
        result = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        if client.returncode != 0 or result is None or len(marks) < 2:
            print("bench: %s failed (exit %s): %s\n%s" % (
                name, client.returncode, result,
                open(err_log).read()[-2000:]), file=sys.stderr)
            return None
    finally:
        for r in relay_procs + parent_procs:
            r.stop()
        server.stop()
        shutil.rmtree(os.path.join(tmp, name + "-data"), ignore_errors=True)
    ((cpu0, flt0, ccpu0, _, rcpu0, t0),
     (cpu1, flt1, ccpu1, rss1, rcpu1, t1)) = marks
    n = result["contributions"]
    row = dict(result)
    row.update({
        "server_cpu_us_per_contribution": (cpu1 - cpu0) / n * 1e6,
        "server_idle_cpu_share": idle_share,
        "server_net_cpu_us_per_contribution":
            max(0.0, cpu1 - cpu0 - idle_share * (t1 - t0)) / n * 1e6,
        "client_cpu_us_per_contribution": (ccpu1 - ccpu0) / n * 1e6,
        "server_rss_bytes": rss1,
        "server_rss_base_bytes": base_rss,
        "rss_per_rank_bytes": (rss1 - base_rss) / w,
        "minor_faults_per_contribution": (flt1 - flt0) / n,
        "relays": len(relay_procs),
        "relay_block": relays[1] if relay_procs else 0,
        "relay_parents": ",".join(str(b) for b in relays[2])
                         if relay_procs else "",
        "relay_cpu_us_per_contribution": (rcpu1 - rcpu0) / n * 1e6,
    })
    return {k: row[k] for k in KEYS + RELAY_KEYS}


def default_rounds(w, layers):
    """Rounds (a multiple of L) for TARGET_CONTRIBUTIONS, at least L."""
    steps = max(1, -(-TARGET_CONTRIBUTIONS // (w * layers)))
    return steps * layers


def ms_pair(row, what):
    return "%.2f / %.2f" % (row[what + "_p50_ms"], row[what + "_p99_ms"])


def print_tables(rows, configs):
    lat, cost = [], []
    for cfg in configs:
        s, f = rows.get(cfg + ("syncnorm",)), rows.get(cfg + ("floor",))
        if s is None or f is None:
            continue
        w, layers, c, mode = cfg
        head = [w, layers, c, mode, s["rounds"]]
        lat.append(head + [ms_pair(s, "round"), ms_pair(f, "round"),
                           ms_pair(s, "completion"), ms_pair(f, "completion"),
                           "%.2fx" % (s["completion_p50_ms"]
                                      / f["completion_p50_ms"])])
        cost.append(head + [
            "%.1f / %.1f" % (s["server_cpu_us_per_contribution"],
                             f["server_cpu_us_per_contribution"]),
            "%.1f / %.1f" % (s["client_cpu_us_per_contribution"],
                             f["client_cpu_us_per_contribution"]),
            "%.1f / %.1f" % (s["rss_per_rank_bytes"] / 1024,
                             f["rss_per_rank_bytes"] / 1024),
            "%.0f / %.0f" % (s["server_rss_bytes"] / 2**20,
                             f["server_rss_bytes"] / 2**20),
            "%.2f / %.2f" % (s["minor_faults_per_contribution"],
                             f["minor_faults_per_contribution"]),
            "%d / %d" % (s["request_bytes"], s["answer_bytes"])])
    print("\n### Rounds of W ranks (ms, p50 / p99 over the measured rounds; "
          "syncnorm durable, floor = bench-server --floor)\n")
    common.table(["W", "L", "C", "mode", "rounds", "round, syncnorm",
                  "round, floor", "completion, syncnorm", "completion, floor",
                  "completion p50 vs floor"], lat)
    print("\n### What a contribution costs (syncnorm / floor)\n")
    common.table(["W", "L", "C", "mode", "rounds",
                  "server CPU us / contribution",
                  "client CPU us / contribution", "server RSS KiB / rank",
                  "server RSS MiB after", "minor faults / contribution",
                  "request / answer bytes"], cost)


def print_relayed(rows, configs):
    out = []
    for cfg in configs:
        r, s = rows.get(cfg + ("relayed",)), rows.get(cfg + ("syncnorm",))
        if r is None or s is None:
            continue
        w, layers, c, mode = cfg
        tree = "%d x %d" % (r["relays"], r["relay_block"])
        for block in filter(None, r.get("relay_parents", "").split(",")):
            tree += " < 1 x %s" % block
        out.append([w, layers, c, mode, tree,
                    ms_pair(r, "round"), ms_pair(s, "round"),
                    "%.2fx" % (r["round_p50_ms"] / s["round_p50_ms"]),
                    "%.1f / %.1f" % (r["server_cpu_us_per_contribution"],
                                     s["server_cpu_us_per_contribution"]),
                    "%.1f / %.1f (idle %.1f%%)" % (
                        r["server_net_cpu_us_per_contribution"],
                        s["server_net_cpu_us_per_contribution"],
                        100 * r["server_idle_cpu_share"]),
                    "%.1f" % r["relay_cpu_us_per_contribution"],
                    "%.1f / %.1f" % (r["rss_per_rank_bytes"] / 1024,
                                     s["rss_per_rank_bytes"] / 1024)])
    if not out:
        return
    print("\n### Through relays against direct (same run; the relays, the "
          "shard and the client share the machine's cores)\n")
    common.table(["W", "L", "C", "mode", "relays x block (< parents)",
                  "round, relayed (ms p50 / p99)", "round, direct",
                  "round p50 relayed vs direct",
                  "shard CPU us / rank's contribution, relayed / direct",
                  "the same net of the shard's idle CPU",
                  "relays' CPU us / rank's contribution",
                  "shard RSS KiB / rank, relayed / direct"], out)
    for cfg in configs:
        r, s = rows.get(cfg + ("relayed",)), rows.get(cfg + ("syncnorm",))
        if r is None or s is None:
            continue
        tag = "W=%d,L=%d,C=%d,%s" % cfg
        common.ratio("relayed_shard_cpu_per_rank_contribution[%s]" % tag,
                     r["server_cpu_us_per_contribution"],
                     "direct_shard_cpu", s["server_cpu_us_per_contribution"],
                     "us")
        common.ratio("relayed_shard_net_cpu_per_rank_contribution[%s]" % tag,
                     r["server_net_cpu_us_per_contribution"],
                     "direct_shard_net_cpu",
                     s["server_net_cpu_us_per_contribution"], "us")
        common.ratio("relayed_round_p50[%s]" % tag, r["round_p50_ms"],
                     "direct_round_p50", s["round_p50_ms"], "ms")


def print_ratios(rows, worlds, layer_list, channel_list, modes):
    big = 1024 if 1024 in worlds else max(worlds)
    small = 8 if 8 in worlds else min(worlds)
    pinned = big == 1024 and small == 8
    print()
    for layers in layer_list:
        for c in channel_list:
            for mode in modes:
                tag = "L=%d,C=%d,%s" % (layers, c, mode)
                s_big = rows.get((big, layers, c, mode, "syncnorm"))
                f_big = rows.get((big, layers, c, mode, "floor"))
                s_small = rows.get((small, layers, c, mode, "syncnorm"))
                f_small = rows.get((small, layers, c, mode, "floor"))
                if None in (s_big, f_big, s_small, f_small):
                    continue
                common.ratio("completion_p50[W=%d,%s]" % (big, tag),
                             s_big["completion_p50_ms"], "floor_completion_p50",
                             f_big["completion_p50_ms"], "ms",
                             1.0 if big == 1024 else None)
                cpu = "server_cpu_us_per_contribution"
                growth = common.ratio(
                    "server_cpu_per_contribution[W=%d,%s]" % (big, tag),
                    s_big[cpu], "same_at_W=%d" % small, s_small[cpu], "us",
                    1.2 if pinned else None)
                floor_growth = common.ratio(
                    "floor_cpu_per_contribution[W=%d,%s]" % (big, tag),
                    f_big[cpu], "floor_same_at_W=%d" % small, f_small[cpu],
                    "us")
                common.ratio("server_cpu_growth[W=%d/W=%d,%s]" % (big, small, tag),
                             growth, "floor_growth", floor_growth, "x",
                             1.1 if pinned else None)
                common.ratio("rss_per_rank[W=%d,%s]" % (big, tag),
                             s_big["rss_per_rank_bytes"],
                             "two_payloads_plus_64KiB",
                             2 * 16 * c + RSS_ALLOWANCE, "bytes")
    # The fit rss_per_rank = a * (2 * 16 * C) + b over the two C values.
    if len(channel_list) >= 2:
        c0, c1 = min(channel_list), max(channel_list)
        for kind in ("syncnorm", "floor"):
            for layers in layer_list:
                for mode in modes:
                    r0 = rows.get((big, layers, c0, mode, kind))
                    r1 = rows.get((big, layers, c1, mode, kind))
                    if r0 is None or r1 is None:
                        continue
                    slope = ((r1["rss_per_rank_bytes"] - r0["rss_per_rank_bytes"])
                             / (2 * 16 * (c1 - c0)))
                    const = r0["rss_per_rank_bytes"] - slope * 2 * 16 * c0
                    common.ratio(
                        "%s_rss_per_rank_growth[W=%d,L=%d,%s,C=%d->%d]"
                        % (kind, big, layers, mode, c0, c1),
                        r1["rss_per_rank_bytes"] - r0["rss_per_rank_bytes"],
                        "two_payloads_growth", 2 * 16 * (c1 - c0), "bytes")
                    print("FIT %s rss_per_rank[W=%d,L=%d,%s] = %.2f x two "
                          "payloads + %.0f bytes" % (kind, big, layers, mode,
                                                     slope, const))


def parse_ints(text):
    return [int(v) for v in text.split(",") if v]


def main():
    global RELAY_BINARY
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--worlds", default="8,64,256,1024,4096")
    p.add_argument("--layers", default="1,4")
    p.add_argument("--channels", default="256,2048")
    p.add_argument("--modes", default="lockstep,pipelined")
    p.add_argument("--relays", type=int, default=0,
                   help="also run each configuration through this many "
                   "relays (relay/syncnorm_relay), each serving a "
                   "contiguous run of W / relays ranks")
    p.add_argument("--relay_block", type=int, default=8,
                   help="the relays' --block_positions")
    p.add_argument("--relay_parents", default="",
                   help="a tree: block sizes of one relay per upper level, "
                   "bottom up (each larger than the level's below, and a "
                   "power of two), e.g. 64,4096")
    p.add_argument("--relay_binary", default=RELAY_BINARY,
                   help="the relays' binary: this build's, or another "
                   "build's to compare (a path)")
    p.add_argument("--rounds", type=int, default=0,
                   help="measured rounds per configuration (rounded up to a "
                   "multiple of L); 0: %d contributions' worth, at least L"
                   % TARGET_CONTRIBUTIONS)
    default_json = os.path.join(
        os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", "/tmp"),
        "syncnorm-wide.jsonl")
    p.add_argument("--json", default=default_json,
                   help="JSON lines, one per server and configuration")
    a = p.parse_args()
    RELAY_BINARY = a.relay_binary
    if a.smoke:
        a.worlds, a.layers, a.channels, a.rounds = "8,64", "1", "256", 20
        a.relays = max(a.relays, 2)
        a.relay_parents = a.relay_parents or "16"
    worlds, layer_list = parse_ints(a.worlds), parse_ints(a.layers)
    channel_list, modes = parse_ints(a.channels), a.modes.split(",")
    # The client and the server each hold a socket per rank.
    raise_fd_limit(max(worlds) + 1024)
    tmp = common.scratch_dir("wide")
    rows, configs, failed = {}, [], []
    json_out = open(a.json, "w")
    started = time.time()
    for w in worlds:
        for layers in layer_list:
            rounds = (-(-a.rounds // layers) * layers if a.rounds
                      else default_rounds(w, layers))
            for c in channel_list:
                for mode in modes:
                    cfg = (w, layers, c, mode)
                    configs.append(cfg)
                    # Alternating which goes first, so that a drift of
                    # the machine's speed favours neither.
                    order = ["syncnorm", "floor"]
                    if a.relays > 0:
                        order.append("relayed")
                    if len(configs) % 2 == 0:
                        order.reverse()
                    for kind in order:
                        row = run_one(kind, w, layers, c, mode, rounds, tmp,
                                      len(configs),
                                      (a.relays, a.relay_block,
                                       tuple(parse_ints(a.relay_parents))))
                        if row is None:
                            failed.append(cfg + (kind,))
                            continue
                        rows[cfg + (kind,)] = row
                        json_out.write(json.dumps(row) + "\n")
                        json_out.flush()
    json_out.close()
    print_tables(rows, configs)
    print_relayed(rows, configs)
    print_ratios(rows, worlds, layer_list, channel_list, modes)
    print("\n(%d configurations x %d servers in %.0f s; rows in %s)"
          % (len(configs), 3 if a.relays > 0 else 2, time.time() - started,
             a.json))
    if failed:
        sys.exit("bench: failed (errors or closed streams): %s" % failed)


if __name__ == "__main__":
    main()
    common.require_ratios()
