"""Round latency (issue 8, item 1): forward-round p50/p99 of syncnorm with W
worker processes and C channels against, in the same run,
  gloo  - what torch.nn.SyncBatchNorm sends per forward (all_gather of
          [mean, invstd, count] over torch.distributed gloo, W processes),
  ping  - one gRPC bidirectional-stream ping-pong of the same payload
          (bench Echo; the floor of any gRPC round),
  star  - a naive aggregator: sync-API gRPC server, a thread per stream,
          gathers W contributions and answers all (bench Star),
  lean  - the least aggregator on gRPC's callback API, as syncnorm's is:
          gathers, merges and answers, nothing more (bench Lean); what
          syncnorm's server does beyond that is what it costs over lean,
  lean-cq - the same Lean on gRPC's asynchronous API, one thread polling
          the completion queue and running the rounds (bench-server
          --cq_threads=1): what the callback API's threads cost.
Also syncnorm with --data_dir= (state in memory, not durable): the same
rounds without the per-round commit, which shows what durability costs;
and the same durable rounds of a job with statistics health off
(disable_stats_health), run right after, which shows what scoring every
round costs.
Every worker times every round; percentiles are over all ranks' rounds.
The servers' CPU time per round is reported too (the workers and the server
share the machine's cores, so it bounds the round at larger W): for the
ping-pong, per exchange, times W (a round's W exchanges of the same bytes).
The kernel counts CPU time in ticks (10 ms here): run a few thousand rounds
for a figure within a few us.

With --baseline_aggregator=BIN, it then runs --pairs pairs of the same
durable rounds against this build's aggregator and BIN in turn (fresh
servers, alternating which goes first), and prints each pair's p50s and
their ratio, and the median ratio: on a shared machine whose speed drifts
by tens of percent within minutes, the ratio within a pair is what
compares two builds.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def worker_argvs(mode, address, world, channels, rounds, warmup, job,
                 health=True):
    return [[common.runfile("bench/bench-round-worker"), "--mode=" + mode,
             "--address=" + address, "--job=" + job, "--rank=%d" % r,
             "--world=%d" % world, "--channels=" + channels,
             "--rounds=%d" % rounds, "--warmup=%d" % warmup,
             "--stats_health=%s" % ("true" if health else "false")]
            for r in range(world if mode != "pingpong" else 1)]


def gloo_argvs(world, channels, rounds, warmup):
    port = common.free_port()
    return [[common.PYTHON, os.path.join(common.HERE, "gloo_worker.py"),
             "--mode=allgather", "--rank=%d" % r, "--world=%d" % world,
             "--port=%d" % port, "--channels=" + channels,
             "--rounds=%d" % rounds, "--warmup=%d" % warmup]
            for r in range(world)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--worlds", default="2,4,8")
    p.add_argument("--channels", default="64,512,2048,8192")
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--baseline_aggregator", default="",
                   help="another aggregator binary to compare in pairs")
    p.add_argument("--pairs", type=int, default=5)
    a = p.parse_args()
    if a.smoke:
        a.worlds, a.channels, a.rounds, a.warmup = "2", "64,2048", 10, 3
    worlds = [int(w) for w in a.worlds.split(",")]
    tmp = common.scratch_dir("round-latency")
    aggregator = common.Server("server/syncnorm-aggregator", tmp, "aggregator")
    in_memory = common.Server("server/syncnorm-aggregator", tmp, "in-memory",
                              ["--data_dir="])
    refs = common.Server("bench/bench-server", tmp, "bench-server")
    lean_cq = common.Server("bench/bench-server", tmp, "bench-server-cq",
                            ["--cq_threads=1"])
    rows, results, cpu_rows = [], {}, []
    # Rounds each worker runs in a group: every C of the list, in turn.
    rounds_run = (a.rounds + a.warmup) * len(a.channels.split(","))

    def timed(server, argvs):
        """The group's stdouts and the server's CPU us per round."""
        cpu0 = server.cpu_seconds()
        outs = common.run_group(argvs)
        return outs, (server.cpu_seconds() - cpu0) / rounds_run * 1e6

    try:
        for w in worlds:
            lat, cpu = {}, {}
            # Interleaved per W so that each comparison shares its minute of
            # machine noise.
            outs, cpu["syncnorm"] = timed(aggregator, worker_argvs(
                "syncnorm", aggregator.address, w, a.channels, a.rounds,
                a.warmup, "lat-w%d" % w))
            lat["syncnorm"] = common.parse_lines(outs, "LAT")
            outs, cpu["nohealth"] = timed(aggregator, worker_argvs(
                "syncnorm", aggregator.address, w, a.channels, a.rounds,
                a.warmup, "nohealth-w%d" % w, health=False))
            lat["nohealth"] = common.parse_lines(outs, "LAT")
            outs, cpu["memory"] = timed(in_memory, worker_argvs(
                "syncnorm", in_memory.address, w, a.channels, a.rounds,
                a.warmup, "mem-w%d" % w))
            lat["memory"] = common.parse_lines(outs, "LAT")
            lat["gloo"] = common.parse_lines(common.run_group(
                gloo_argvs(w, a.channels, a.rounds, a.warmup)), "LAT")
            outs, cpu["star"] = timed(refs, worker_argvs(
                "star", refs.address, w, a.channels, a.rounds, a.warmup, ""))
            lat["star"] = common.parse_lines(outs, "LAT")
            outs, cpu["lean"] = timed(refs, worker_argvs(
                "lean", refs.address, w, a.channels, a.rounds, a.warmup, ""))
            lat["lean"] = common.parse_lines(outs, "LAT")
            outs, cpu["leancq"] = timed(lean_cq, worker_argvs(
                "lean", lean_cq.address, w, a.channels, a.rounds, a.warmup, ""))
            lat["leancq"] = common.parse_lines(outs, "LAT")
            outs, cpu["ping"] = timed(refs, worker_argvs(
                "pingpong", refs.address, w, a.channels, a.rounds, a.warmup, ""))
            lat["ping"] = common.parse_lines(outs, "LAT")
            cpu_rows.append([w, a.channels] + ["%.0f" % cpu[k] for k in
                                               ("syncnorm", "nohealth",
                                                "memory", "lean",
                                                "leancq", "star")] +
                            ["%.0f" % (w * cpu["ping"])])
            for c in a.channels.split(","):
                q = {k: (common.percentile(v[c], 50), common.percentile(v[c], 99))
                     for k, v in lat.items()}
                results[(w, int(c))] = q
                rows.append([w, c] + ["%.0f / %.0f" % q[k] for k in
                                      ("syncnorm", "memory", "gloo", "ping",
                                       "lean", "leancq", "star")] +
                            ["%.2fx" % (q["syncnorm"][0] / q[k][0])
                             for k in ("gloo", "ping", "lean", "leancq",
                                       "star", "memory")])
        print("\n### Round latency (us, p50 / p99 over all ranks' rounds)\n")
        common.table(["W", "C", "syncnorm", "syncnorm, state in memory",
                      "gloo all_gather", "gRPC ping-pong",
                      "lean (callback API)", "lean (async API, 1 thread)",
                      "gRPC star (thread/stream)", "p50 vs gloo",
                      "p50 vs ping", "p50 vs lean", "p50 vs lean-cq",
                      "p50 vs star", "p50 vs in memory"], rows)
        print("\n### Server CPU per round (us; averaged over the C values "
              "run)\n")
        common.table(["W", "C", "syncnorm", "syncnorm, health off",
                      "syncnorm, state in memory",
                      "lean (callback API)", "lean (async API, 1 thread)",
                      "gRPC star (thread/stream)",
                      "W gRPC ping-pongs (echo server)"], cpu_rows)
        if a.baseline_aggregator:
            pairs = paired(a, worlds, tmp)
        print()
        for (w, c), q in sorted(results.items()):
            tag = "round_p50[W=%d,C=%d]" % (w, c)
            pinned_gloo = (w, c) == (2, 2048)
            common.ratio(tag, q["syncnorm"][0], "gloo_allgather_p50", q["gloo"][0],
                         "us", 0.5 if pinned_gloo else None)
            common.ratio(tag, q["syncnorm"][0], "grpc_pingpong_p50", q["ping"][0],
                         "us", 2.0 if pinned_gloo else None)
            common.ratio(tag, q["syncnorm"][0], "lean_callback_p50",
                         q["lean"][0], "us")
            common.ratio("in_memory_p50[W=%d,C=%d]" % (w, c), q["memory"][0],
                         "lean_callback_p50", q["lean"][0], "us")
            common.ratio("lean_async_p50[W=%d,C=%d]" % (w, c), q["leancq"][0],
                         "lean_callback_p50", q["lean"][0], "us")
            common.ratio("lean_async_p50[W=%d,C=%d]" % (w, c), q["leancq"][0],
                         "grpc_pingpong_p50", q["ping"][0], "us")
            # Issue 18's targets: W = 8 within 0.7x the thread-per-stream
            # star; a durable p99 within 1.5x the in-memory one at W = 2.
            common.ratio(tag, q["syncnorm"][0], "grpc_star_p50", q["star"][0],
                         "us", 0.7 if w == 8 else None)
            common.ratio(tag, q["syncnorm"][0], "in_memory_p50", q["memory"][0],
                         "us")
            # Issue 34: statistics health costs no measurable latency.
            common.ratio(tag, q["syncnorm"][0], "stats_health_off_p50",
                         q["nohealth"][0], "us")
            common.ratio("round_p99[W=%d,C=%d]" % (w, c), q["syncnorm"][1],
                         "in_memory_p99", q["memory"][1], "us",
                         1.5 if w == 2 else None)
        if a.baseline_aggregator:
            for (w, c), (ours, theirs) in sorted(pairs.items()):
                # The median pair, by ratio.
                k = sorted(range(len(ours)), key=lambda i: ours[i] / theirs[i])
                m = k[len(k) // 2]
                common.ratio("round_p50[W=%d,C=%d] median pair" % (w, c),
                             ours[m], "baseline_p50", theirs[m], "us")
    finally:
        aggregator.stop()
        in_memory.stop()
        refs.stop()
        lean_cq.stop()


def paired(a, worlds, tmp):
    """Durable p50s of this build and the baseline, pair by pair:
    {(W, C): ([ours...], [baseline's...])}; prints the pairs' table."""
    binaries = [("this build", "server/syncnorm-aggregator"),
                ("baseline", a.baseline_aggregator)]
    got, rows = {}, []
    for w in worlds:
        for i in range(a.pairs):
            p50 = {}
            # Alternating which goes first, so that a drift of the
            # machine's speed does not favour one side.
            for name, binary in binaries if i % 2 == 0 else binaries[::-1]:
                server = common.Server(binary, tmp, "pair%d-%d-%s" % (
                    w, i, name.replace(" ", "-")))
                try:
                    lat = common.parse_lines(common.run_group(worker_argvs(
                        "syncnorm", server.address, w, a.channels, a.rounds,
                        a.warmup, "pair")), "LAT")
                finally:
                    server.stop()
                p50[name] = {c: common.percentile(v, 50) for c, v in lat.items()}
            for c in a.channels.split(","):
                ours, theirs = p50["this build"][c], p50["baseline"][c]
                ours_all, theirs_all = got.setdefault((w, int(c)), ([], []))
                ours_all.append(ours)
                theirs_all.append(theirs)
                rows.append([w, c, i + 1, "%.0f" % ours, "%.0f" % theirs,
                             "%.3fx" % (ours / theirs)])
    print("\n### Durable round p50 in pairs against %s (us)\n" %
          a.baseline_aggregator)
    common.table(["W", "C", "pair", "this build", "baseline", "ratio"], rows)
    return got


if __name__ == "__main__":
    main()
    common.require_ratios()
