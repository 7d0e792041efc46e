"""Throughput (issue 8, item 2): contributions merged per second at
saturation, many concurrent jobs and layers, C = 256.
  in-process: the Aggregator with one driver thread per core, against the
              bare Chan merge of the same contributions (arithmetic floor);
  gRPC:       the real aggregator binary driven by J jobs x W Reduce streams
              with several layers in flight each, against bench Echo driven
              the same way with the same payload (this machine's gRPC
              ceiling). Client and server share the 2 cores, so the server's
              CPU time per contribution is reported too (and, in lock-step,
              the client's).
  lock-step:  the shape of a training step (issue 18): 32 jobs x 2 ranks,
              one contribution in flight per stream (each rank sends and
              waits for the answer before its next layer), against the echo
              in the same shape and the same aggregator with its state in
              memory (--data_dir=). The pipelined shape above hides
              per-message costs that a training step pays; this one does
              not. The lean callback-API aggregator (bench Lean: gathers,
              merges, answers, nothing more) in the same shape shows what
              gRPC leaves any aggregator here, and Lean on the asynchronous
              API with one thread what that design gives (see
              round_latency_benchmark). --baseline_aggregator=BINARY adds
              both aggregators again as another build (an older commit's),
              then --pairs=N pairs of the two builds' rates, each pair on
              fresh servers in alternating order (the median pair's ratio
              is what a noisy machine leaves comparable);
              --malloc_preload=LIB with LIB (e.g. Debian's
              libtcmalloc_minimal.so.4) preloaded into the server only;
              --round_log_mib=N adds this build's durable aggregator with
              its round log sized N MiB.
"""

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def drive(server, mode, a, client_cpu=None):
    """Runs the load client against `server`; (answers/s, server CPU us per
    answer). With `client_cpu` (a list), appends the client's CPU us per
    answer over the same window."""
    argv = [common.runfile("bench/bench-throughput-client"), "--mode=" + mode,
            "--address=" + server.address, "--jobs=%d" % a.jobs,
            "--world=%d" % a.world, "--layers=%d" % a.layers,
            "--channels=%d" % a.channels, "--window=%d" % a.window,
            "--warmup_s=%g" % a.warmup_s, "--seconds=%g" % a.seconds]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    cpu0 = None
    answers = errors = secs = None
    for line in proc.stdout:
        parts = line.split()
        if parts and parts[0] == "WINDOW_BEGIN":
            cpu0 = server.cpu_seconds()
            client0 = common.cpu_seconds(proc.pid)
        elif parts and parts[0] == "THROUGHPUT":
            cpu1 = server.cpu_seconds()
            client1 = common.cpu_seconds(proc.pid)
            answers, errors, secs = int(parts[1]), int(parts[2]), float(parts[3])
    if proc.wait() != 0 or answers is None:
        sys.exit("bench: throughput client failed (%s)" % mode)
    if errors:
        # Reported, not fatal: failed rounds at saturation are a finding.
        print("bench: %d of %d %s answers were errors (see stderr)" %
              (errors, answers + errors, mode), flush=True)
    if answers == 0:
        sys.exit("bench: no %s answer succeeded" % mode)
    if client_cpu is not None:
        client_cpu.append((client1 - client0) / answers * 1e6)
    return answers / secs, (cpu1 - cpu0) / max(answers, 1) * 1e6


def lockstep(a, tmp):
    """The lock-step table and its RATIO lines."""
    ls = argparse.Namespace(**vars(a))
    ls.jobs, ls.world, ls.window = a.lockstep_jobs, 2, 1
    rows = []
    measured = {}
    servers = [
        ("gRPC echo, same streams and payload", "bench/bench-server", (),
         "echo", None),
        ("syncnorm aggregator, state in memory", "server/syncnorm-aggregator",
         ("--data_dir=",), "syncnorm", None),
        ("syncnorm aggregator, durable", "server/syncnorm-aggregator", (),
         "syncnorm", None),
        ("lean callback-API aggregator (bench Lean)", "bench/bench-server", (),
         "lean", None),
        ("lean on the async API, one thread (bench Lean, --cq_threads=1)",
         "bench/bench-server", ("--cq_threads=1",), "lean", None)]
    # The two aggregators again: another build (a baseline), or this one
    # with another malloc preloaded into the server.
    variants = []  # (RATIO tag, row label, binary, environment)
    if a.baseline_aggregator:
        variants.append(("baseline", "baseline " + a.baseline_aggregator,
                         a.baseline_aggregator, None))
    if a.malloc_preload:
        variants.append(("preloaded",
                         os.path.basename(a.malloc_preload) + " preloaded",
                         "server/syncnorm-aggregator",
                         {"LD_PRELOAD": a.malloc_preload}))
    for _, label, binary, env in variants:
        servers += [(name + ", " + label, binary, extra, mode, env)
                    for name, _, extra, mode, _ in servers[1:3]]
    sized = None
    if a.round_log_mib:
        # This build's durable aggregator with its round log sized for the
        # shape (docs/operations.md, "Sizing it").
        sized = "syncnorm aggregator, durable, --round_log_mib=%d" % a.round_log_mib
        servers.append((sized, "server/syncnorm-aggregator",
                        ("--round_log_mib=%d" % a.round_log_mib,), "syncnorm",
                        None))
    for name, binary, extra, mode, env in servers:
        server = common.Server(binary, tmp, "lockstep-" + mode + str(len(rows)),
                               extra, env)
        client = []
        try:
            per_s, cpu = drive(server, mode, ls, client)
        finally:
            server.stop()
        measured[name] = per_s
        rows.append([name, "%.0f" % per_s, "%.1f" % cpu, "%.1f" % client[0]])
    echo, memory, durable, lean, lean_cq = (measured[r[0]] for r in rows[:5])
    for r in rows:
        r.append("%.2fx" % (measured[r[0]] / echo))
    print("\n### Lock-step throughput, C = %d: %d jobs x 2 ranks x %d layers, "
          "1 in flight per stream\n" % (a.channels, ls.jobs, a.layers))
    common.table(["path", "contributions/s", "server CPU us per message",
                  "client CPU us per message", "vs echo"], rows)
    # Client and server share the machine's cores: at the target rate, this
    # is what both together may spend on a message.
    budget = os.cpu_count() / 50000.0 * 1e6
    print("\nAt 50,000/s, %d cores give client and server together %.0f us "
          "of CPU per message." % (os.cpu_count(), budget))
    print()
    common.ratio("lockstep_durable_per_s", durable, "lockstep_echo_per_s", echo,
                 "/s")
    common.ratio("lockstep_durable_per_s", durable, "lockstep_in_memory_per_s",
                 memory, "/s")
    common.ratio("lockstep_durable_per_s", durable, "target", 50000.0, "/s",
                 1.0, higher_is_better=True)
    common.ratio("lockstep_durable_per_s", durable, "lockstep_lean_per_s", lean,
                 "/s")
    common.ratio("lockstep_in_memory_per_s", memory, "lockstep_lean_per_s",
                 lean, "/s")
    common.ratio("lockstep_lean_async_per_s", lean_cq, "lockstep_lean_per_s",
                 lean, "/s")
    for k, (tag, _, _, _) in enumerate(variants):
        common.ratio("lockstep_in_memory_%s_per_s" % tag,
                     measured[rows[5 + 2 * k][0]], "lockstep_in_memory_per_s",
                     memory, "/s")
        common.ratio("lockstep_durable_%s_per_s" % tag,
                     measured[rows[6 + 2 * k][0]], "lockstep_durable_per_s",
                     durable, "/s")
    if a.baseline_aggregator and a.pairs > 0:
        paired(a, ls, tmp)
    if sized is not None:
        common.ratio("lockstep_durable_sized_log_per_s", measured[sized],
                     "lockstep_durable_per_s", durable, "/s")
        # The deployment's ring (deploy/base sets one sized for such jobs).
        common.ratio("lockstep_durable_sized_log_per_s", measured[sized],
                     "target", 50000.0, "/s", 1.0, higher_is_better=True)


def paired(a, ls, tmp):
    """Lock-step rates of this build and the baseline, in --pairs pairs per
    state mode; prints the pairs' table and each mode's median pair."""
    binaries = [("this build", "server/syncnorm-aggregator"),
                ("baseline", a.baseline_aggregator)]
    rows, median = [], []
    for mode, extra in (("in memory", ("--data_dir=",)), ("durable", ())):
        ratios = []
        for i in range(a.pairs):
            per_s = {}
            # Alternating which goes first, so that a drift of the machine's
            # speed does not favour one side.
            for name, binary in binaries if i % 2 == 0 else binaries[::-1]:
                server = common.Server(binary, tmp, "pair-%s-%d-%s" % (
                    mode.replace(" ", "-"), i, name.replace(" ", "-")), extra)
                try:
                    per_s[name] = drive(server, "syncnorm", ls)[0]
                finally:
                    server.stop()
            ours, theirs = per_s["this build"], per_s["baseline"]
            ratios.append((ours / theirs, ours, theirs))
            rows.append([mode, i + 1, "%.0f" % ours, "%.0f" % theirs,
                         "%.3fx" % (ours / theirs)])
        median.append((mode, sorted(ratios)[len(ratios) // 2]))
    print("\n### Lock-step contributions/s in pairs against %s\n" %
          a.baseline_aggregator)
    common.table(["state", "pair", "this build", "baseline", "ratio"], rows)
    print()
    for mode, (_, ours, theirs) in median:
        tag = mode.replace(" ", "_")
        common.ratio("lockstep_%s_per_s median pair" % tag, ours,
                     "baseline_%s_per_s" % tag, theirs, "/s")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--warmup_s", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--lockstep_jobs", type=int, default=32,
                   help="jobs of the lock-step shape (2 ranks each)")
    p.add_argument("--only", choices=("all", "pipelined", "lockstep"),
                   default="all")
    p.add_argument("--baseline_aggregator", default="",
                   help="lock-step shape: also run this aggregator binary "
                        "(e.g. an older build)")
    p.add_argument("--pairs", type=int, default=0,
                   help="lock-step shape, with --baseline_aggregator: also "
                        "compare the two builds in this many pairs")
    p.add_argument("--round_log_mib", type=int, default=0,
                   help="lock-step shape: also run this build's durable "
                   "aggregator with --round_log_mib=N (0: not)")
    p.add_argument("--malloc_preload", default="",
                   help="lock-step shape: also run the aggregators with this "
                        "malloc library preloaded")
    a = p.parse_args()
    if a.smoke:
        a.jobs, a.layers, a.warmup_s, a.seconds = 2, 4, 0.2, 0.5
        a.lockstep_jobs = 2
        a.window = min(a.window, a.layers)
    if a.only == "lockstep":
        lockstep(a, common.scratch_dir("throughput"))
        return
    inproc_out = common.run_group([[
        common.runfile("bench/bench-throughput-inproc"), "--jobs=%d" % a.jobs,
        "--world=%d" % a.world, "--layers=%d" % a.layers,
        "--channels=%d" % a.channels, "--threads=2",
        "--seconds=%g" % (a.seconds / 2)]])[0]
    vals = dict(line.split() for line in inproc_out.splitlines() if line.strip())
    inproc, merge = float(vals["INPROC"]), float(vals["MERGE"])
    tmp = common.scratch_dir("throughput")
    aggregator = common.Server("server/syncnorm-aggregator", tmp, "aggregator")
    refs = common.Server("bench/bench-server", tmp, "bench-server")
    try:
        echo, echo_cpu = drive(refs, "echo", a)
        grpc, grpc_cpu = drive(aggregator, "syncnorm", a)
    finally:
        aggregator.stop()
        refs.stop()
    print("\n### Throughput, C = %d: %d jobs x %d ranks x %d layers, %d in flight "
          "per stream\n" % (a.channels, a.jobs, a.world, a.layers, a.window))
    common.table(["path", "contributions/s", "server CPU us per message"], [
        ["syncnorm Aggregator in-process (2 threads)", "%.0f" % inproc, "-"],
        ["bare Chan merge + finalize (2 threads)", "%.0f" % merge, "-"],
        ["syncnorm aggregator over gRPC", "%.0f" % grpc, "%.1f" % grpc_cpu],
        ["gRPC echo, same streams and payload", "%.0f" % echo, "%.1f" % echo_cpu],
    ])
    print()
    common.ratio("inproc_contributions_per_s", inproc, "bare_merge_per_s", merge, "/s")
    common.ratio("grpc_contributions_per_s", grpc, "grpc_echo_per_s", echo, "/s")
    common.ratio("grpc_contributions_per_s", grpc, "target", 50000.0, "/s", 1.0,
                 higher_is_better=True)
    common.ratio("server_cpu_us_per_contribution", grpc_cpu,
                 "echo_server_cpu_us_per_message", echo_cpu, "us")
    if a.only == "all":
        lockstep(a, tmp)


if __name__ == "__main__":
    main()
    common.require_ratios()
