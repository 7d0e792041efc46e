"""Step overhead (issue 8, item 4): the sync rounds of the 53 BN layers of
ResNet-50 (real channel counts; counts of batch 32 per worker at 224x224),
53 forward rounds in layer order then 53 backward rounds in reverse order,
W worker processes; milliseconds per step against the same collectives done
with gloo (all_gather of [mean, invstd, count] forward, all_reduce of
[sum_dy, sum_dy_xmu] backward), as torch.nn.SyncBatchNorm issues them.
Kernels are not run: this is the communication a step adds."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    if a.smoke:
        a.world, a.steps, a.warmup = 2, 2, 1
    tmp = common.scratch_dir("step-overhead")
    aggregator = common.Server("server/syncnorm-aggregator", tmp, "aggregator")
    try:
        sn = common.parse_lines(common.run_group([
            [common.runfile("bench/bench-round-worker"), "--mode=resnet",
             "--address=" + aggregator.address, "--job=resnet50",
             "--rank=%d" % r, "--world=%d" % a.world, "--batch=32",
             "--rounds=%d" % a.steps, "--warmup=%d" % a.warmup]
            for r in range(a.world)]), "STEP")[""]
        port = common.free_port()
        gloo = common.parse_lines(common.run_group([
            [common.PYTHON, os.path.join(common.HERE, "gloo_worker.py"),
             "--mode=resnet", "--rank=%d" % r, "--world=%d" % a.world,
             "--port=%d" % port, "--rounds=%d" % a.steps,
             "--warmup=%d" % a.warmup] for r in range(a.world)]), "STEP")[""]
    finally:
        aggregator.stop()
    print("\n### Step overhead, ResNet-50 (53 BN layers, fwd + bwd rounds), "
          "W = %d (ms per step, over all ranks' steps)\n" % a.world)
    rows = []
    for name, v in (("syncnorm", sn), ("gloo", gloo)):
        rows.append([name, "%.2f" % common.percentile(v, 50),
                     "%.2f" % common.percentile(v, 90), "%.2f" % (sum(v) / len(v))])
    common.table(["path", "p50 ms", "p90 ms", "mean ms"], rows)
    print()
    common.ratio("step_ms_p50[W=%d]" % a.world, common.percentile(sn, 50),
                 "gloo_step_ms_p50", common.percentile(gloo, 50), "ms", 0.5)


if __name__ == "__main__":
    main()
    common.require_ratios()
