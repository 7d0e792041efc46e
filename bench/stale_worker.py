"""One rank of staleness_benchmark: creates the job (idempotent, every rank
the same spec), then runs lock-step training steps: "compute" (a sleep of
compute_ms, slow_factor times longer on a slow step), the forward rounds of
every layer in order, the same sleep again, the backward rounds in
reverse order. Prints `RUN rank seconds steps max_lag`: wall time of the
steps after the warm-up, and the largest step - view step seen."""

import argparse
import random
import time

import numpy as np

import syncnorm


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--staleness", type=int, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--compute_ms", type=float, default=10.0)
    p.add_argument("--slow_factor", type=float, default=2.0)
    p.add_argument("--mode", choices=("fixed", "jitter"), default="fixed")
    a = p.parse_args()
    client = syncnorm.Client(a.address, rpc_timeout=30, round_timeout=60)
    specs = [syncnorm.layer_spec("bn%d" % i, a.channels)
             for i in range(a.layers)]
    client.create_job(a.job, a.world, specs, round_timeout_ms=60000,
                      staleness=a.staleness)
    group = client.node_group(a.job, a.rank)
    rng = np.random.default_rng(a.rank)
    mean = rng.standard_normal(a.channels)
    m2 = rng.random(a.channels) * 32 + 1
    # jitter: the slow rank of each step is drawn the same way on every rank.
    slow_of = random.Random(7)
    max_lag = 0
    start = None
    for step in range(a.steps):
        if step == a.warmup:
            start = time.perf_counter()
        slow_rank = (slow_of.randrange(a.world) if a.mode == "jitter"
                     else a.world - 1)
        compute = a.compute_ms / 1000.0
        if a.rank == slow_rank:
            compute *= a.slow_factor
        time.sleep(compute / 2)
        for layer in range(a.layers):
            reply = group.sync_forward(layer, step, 32, mean, m2)
            for _, t in reply[5]:
                max_lag = max(max_lag, step - t)
        time.sleep(compute / 2)
        for layer in reversed(range(a.layers)):
            group.sync_backward(layer, step, mean, m2)
    seconds = time.perf_counter() - start
    print("RUN %d %.6f %d %d" % (a.rank, seconds, a.steps - a.warmup,
                                 max_lag), flush=True)


if __name__ == "__main__":
    main()
