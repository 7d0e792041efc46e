"""One rank of pretrained_test: launched with torch's env:// variables;
each scenario converts a model, attaches it (rank and world size from
torch.distributed) and wraps it in DDP, in that documented order, with a
checkpoint loaded on rank 0 alone, then trains; the records go to
<out>/rank<r>.pt (a scenario that raises records the error)."""

import argparse
import datetime
import os
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cases
import drop_in
import syncnorm
import syncnorm.torch as snt

SHARDS = [3, 5, 2]
STEPS = 3
PRETRAINED_BATCHES = 7


def fresh_model():
    return cases.TwoBN(nn.BatchNorm2d(drop_in.CHANNELS),
                       nn.BatchNorm2d(drop_in.CHANNELS))


def checkpoint(seed):
    """A pretrained model's state_dict: drop_in.torch_model(seed)'s
    parameters and statistics, num_batches_tracked 7."""
    model = drop_in.torch_model(seed).float()
    for bn in drop_in.bns(model):
        bn.num_batches_tracked.fill_(PRETRAINED_BATCHES)
    return model.state_dict()


def run(rank, client, job, seed):
    model = fresh_model()
    if rank == 0:
        model.load_state_dict(checkpoint(seed))
    model = snt.convert_sync_batchnorm(model)
    session = snt.attach(model, client, job, round_timeout_ms=20000)
    out = {"attached": drop_in.buffers(model), "steps": []}
    ddp = DDP(model)
    for step in range(STEPS):
        x, r = drop_in.global_batch(seed, step, SHARDS)
        xr = drop_in.rows(x, rank, SHARDS).float().requires_grad_(True)
        ddp.zero_grad(set_to_none=True)
        y = ddp(xr)
        (y * drop_in.rows(r, rank, SHARDS).float()).sum().backward()
        out["steps"].append({"y": y.detach().double(),
                             "dx": xr.grad.double(),
                             "buffers": drop_in.buffers(model),
                             "service": drop_in.service_stats(session)})
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    client = syncnorm.Client(os.environ["SYNCNORM_ADDRESS"], round_timeout=60)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    results = {}
    for name, seed in (("new", 61), ("existing", 62)):
        try:
            results[name] = run(rank, client, args.run_id + "-" + name, seed)
        except Exception:  # the test reports it as the scenario's failure
            results[name] = {"error": traceback.format_exc()}
            break  # the other ranks may be stuck in a collective
    torch.save(results, os.path.join(args.out, "rank%d.pt" % rank))


if __name__ == "__main__":
    main()
