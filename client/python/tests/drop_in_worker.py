"""One rank of drop_in_test: launched with torch's env:// variables
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) plus TORCHELASTIC_RUN_ID and
SYNCNORM_ADDRESS, as torchrun would; runs every scenario of drop_in.py and
saves its records to <out>/rank<r>.pt (a scenario that raises records the
error and the others still run)."""

import argparse
import datetime
import os
import traceback

import torch
import torch.distributed as dist

import drop_in
import syncnorm


def record(results, name, run):
    try:
        results[name] = run()
    except Exception:  # the test reports it as that scenario's failure
        results[name] = {"error": traceback.format_exc()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    client = syncnorm.Client(os.environ["SYNCNORM_ADDRESS"], round_timeout=60)
    ctx = drop_in.Context(rank, client, args.run_id)
    results = {}
    launch = {}
    record(launch, "env", lambda: drop_in.run_launch_env(ctx))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    record(results, "groups_0_2_and_1_3", lambda: drop_in.run_groups(
        ctx, "groups-a", [[0, 2], [1, 3]], 31))
    record(results, "groups_0_1_3_and_2", lambda: drop_in.run_groups(
        ctx, "groups-b", [[0, 1, 3], [2]], 32))
    record(results, "momentum", lambda: drop_in.run_momentum(ctx))
    record(results, "update_bn", lambda: drop_in.run_update_bn(ctx))
    record(results, "buffers", lambda: drop_in.run_buffers(ctx))
    record(results, "reload", lambda: drop_in.run_reload(ctx))
    record(results, "twice", lambda: drop_in.run_twice(ctx))
    record(results, "freeze", lambda: drop_in.run_frozen(ctx, "freeze"))
    record(results, "use_global_stats",
           lambda: drop_in.run_frozen(ctx, "use_global_stats"))
    record(results, "single_value", lambda: drop_in.run_single_value(ctx))
    record(launch, "dist", lambda: drop_in.run_launch_dist(ctx))
    results["launch"] = launch
    for part in ("env", "dist"):
        if "error" in launch[part]:
            results["launch"] = launch[part]
    torch.save(results, os.path.join(args.out, "rank%d.pt" % rank))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
