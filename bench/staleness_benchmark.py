"""Stale-synchronous jobs against a straggler: W worker processes
(stale_worker.py, the Python client) run lock-step steps of a few layers
(a sleep as compute, forward rounds, a sleep, backward rounds); one rank
is slow_factor times slower. Steps per second of the fast ranks at
staleness tau = 1, 2, 4 against the synchronous job (tau = 0), all in one
run, for two stragglers: "fixed" (the last rank is always slow) and
"jitter" (each step a different rank, drawn at random, is slow). The
largest lag a view showed (step - the oldest step merged) is reported and
must stay within tau."""

import argparse
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import syncnorm  # noqa: E402


def worker_env():
    root = os.path.dirname(os.path.dirname(os.path.abspath(syncnorm.__file__)))
    return {"PYTHONPATH": os.pathsep.join([root] + [q for q in sys.path if q]),
            "OMP_NUM_THREADS": "1"}


def run(aggregator, a, mode, tau):
    job = "stale-%s-%d-%s" % (mode, tau, uuid.uuid4().hex[:6])
    env = dict(os.environ, **worker_env())
    argvs = [[common.PYTHON, os.path.join(common.HERE, "stale_worker.py"),
              "--address=" + aggregator.address, "--job=" + job,
              "--rank=%d" % r, "--world=%d" % a.world,
              "--staleness=%d" % tau, "--steps=%d" % a.steps,
              "--warmup=%d" % a.warmup, "--layers=%d" % a.layers,
              "--compute_ms=%g" % a.compute_ms,
              "--slow_factor=%g" % a.slow_factor, "--mode=" + mode]
             for r in range(a.world)]
    old = dict(os.environ)
    os.environ.update(env)
    try:
        outs = common.run_group(argvs)
    finally:
        os.environ.clear()
        os.environ.update(old)
    runs = {}
    for out in outs:
        for line in out.splitlines():
            f = line.split()
            if f and f[0] == "RUN":
                runs[int(f[1])] = (float(f[2]), int(f[3]), int(f[4]))
    fast = [r for r in range(a.world) if mode == "jitter" or r != a.world - 1]
    rate = sum(runs[r][1] / runs[r][0] for r in fast) / len(fast)
    lag = max(v[2] for v in runs.values())
    if lag > tau:
        sys.exit("bench: a view lagged %d steps in a job of staleness %d"
                 % (lag, tau))
    return rate, lag


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--compute_ms", type=float, default=20.0)
    p.add_argument("--slow_factor", type=float, default=2.0)
    p.add_argument("--taus", default="0,1,2,4")
    a = p.parse_args()
    if a.smoke:
        a.world, a.steps, a.warmup, a.compute_ms = 2, 6, 1, 2.0
    taus = [int(t) for t in a.taus.split(",")]
    if taus[0] != 0:
        taus = [0] + taus
    tmp = common.scratch_dir("staleness")
    aggregator = common.Server("server/syncnorm-aggregator", tmp, "aggregator")
    results = {}
    try:
        for mode in ("fixed", "jitter"):
            for tau in taus:
                results[mode, tau] = run(aggregator, a, mode, tau)
    finally:
        aggregator.stop()
    print("\n### Staleness against a straggler, W = %d, %d layers, %g ms "
          "compute per step (x%g on the slow rank), %d steps\n"
          % (a.world, a.layers, a.compute_ms, a.slow_factor,
             a.steps - a.warmup))
    rows = []
    for mode in ("fixed", "jitter"):
        for tau in taus:
            rate, lag = results[mode, tau]
            rows.append([mode, tau, "%.1f" % rate,
                         "%.2f" % (rate / results[mode, 0][0]), lag])
    common.table(["straggler", "tau", "fast-rank steps/s", "vs tau=0",
                  "max view lag"], rows)
    print()
    for mode in ("fixed", "jitter"):
        for tau in taus[1:]:
            common.ratio("fast_steps_per_s[%s,tau=%d]" % (mode, tau),
                         results[mode, tau][0], "sync_fast_steps_per_s",
                         results[mode, 0][0], "steps/s",
                         higher_is_better=True)


if __name__ == "__main__":
    main()
    common.require_ratios()
