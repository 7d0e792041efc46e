"""One rank of join_test: launched with torch's env:// variables; each
scenario trains 2 epochs of LENGTHS[rank] batches under torch's Join and
saves its records to <out>/rank<r>.pt (a scenario that raises records the
error, and the rest are skipped: the other ranks may be stuck)."""

import argparse
import datetime
import os
import traceback

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

import drop_in
import syncnorm
import syncnorm.torch as snt

LENGTHS = [7, 5, 5, 2]  # batches per epoch of each rank
EPOCHS = 2
GROUPS = [[0, 2], [1, 3]]
EVEN = [3, 3, 3, 3]
SCENARIOS = {  # name: (seed, in DDP, process groups, over 2 shards, lengths)
    "ddp": (71, True, False, False, LENGTHS),
    "plain": (72, False, False, False, LENGTHS),
    "groups": (73, False, True, False, LENGTHS),
    "shards": (74, True, False, True, LENGTHS),
    "even": (76, True, False, False, EVEN),
}


def data_seed(seed, epoch):
    return seed * 10 + epoch


def run(rank, client, job, seed, ddp, groups, lengths):
    pg = None
    if groups:
        handles = [dist.new_group(g) for g in GROUPS]  # every rank, in order
        pg = [h for g, h in zip(GROUPS, handles) if rank in g][0]
    model = drop_in.sync_model(seed, process_group=pg)
    session = snt.attach(model, client, job, round_timeout_ms=20000)
    net = DDP(model) if ddp else model
    joinables = [net, session] if ddp else [session]
    out = {"steps": {}, "epochs": [], "first": session.steps(),
           "versions": [client.get_job(job)["membership"]["version"]]}
    for epoch in range(EPOCHS):
        with Join(joinables):
            for b in range(lengths[rank]):
                x, r = drop_in.global_batch(data_seed(seed, epoch), b)
                xr = drop_in.rows(x, rank).float().requires_grad_(True)
                y = net(xr)
                (y * drop_in.rows(r, rank).float()).sum().backward()
                out["steps"][(epoch, b)] = {"y": y.detach().double(),
                                            "dx": xr.grad.double()}
        out["epochs"].append({"buffers": drop_in.buffers(model),
                              "service": drop_in.service_stats(session),
                              "next": session.steps()})
        out["versions"].append(
            client.get_job(job)["membership"]["version"])
    return out


DEAD_RANK = 3


def run_dies(rank, client, job, save):
    """Rank 3 dies at its second batch of Join([session]): a death is no
    join, the others' rounds fail with DEADLINE_EXCEEDED naming it."""
    model = drop_in.sync_model(75)
    session = snt.attach(model, client, job, round_timeout_ms=3000)
    try:
        with Join([session]):
            for b in range(3):
                if rank == DEAD_RANK and b == 1:
                    save({"died": True})
                    os._exit(0)  # no leave, no Join: as a crash
                x, r = drop_in.global_batch(75, b)
                y = model(drop_in.rows(x, rank).float())
                (y * drop_in.rows(r, rank).float()).sum().backward()
    except syncnorm.ServiceError as e:
        return {"code": e.code, "message": str(e)}
    return {"code": None, "message": "every batch trained"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    client = syncnorm.Client(os.environ["SYNCNORM_ADDRESS"], round_timeout=60)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    sharded = syncnorm.Client(os.environ["JOIN_SHARDS"], round_timeout=60)
    results = {}
    for name, (seed, ddp, groups, shards, lengths) in SCENARIOS.items():
        try:
            results[name] = run(rank, sharded if shards else client,
                                args.run_id + "-" + name, seed, ddp, groups,
                                lengths)
        except Exception:  # the test reports it as the scenario's failure
            results[name] = {"error": traceback.format_exc()}
            break
    path = os.path.join(args.out, "rank%d.pt" % rank)

    def save(dies):
        results["dies"] = dies
        torch.save(results, path)

    if len(results) == len(SCENARIOS) and all(
            "error" not in r for r in results.values()):
        # Last: a dead rank leaves the process group broken.
        try:
            save(run_dies(rank, client, args.run_id + "-dies", save))
        except Exception:
            save({"error": traceback.format_exc()})
    else:
        save({"error": "not run (an earlier scenario failed)"})
    os._exit(0)  # the broken process group's threads do not hold the exit


if __name__ == "__main__":
    main()
