"""One torch.distributed (gloo) worker: the collectives torch.nn.SyncBatchNorm
issues, timed. Prints `LAT <C> <us>...` (mode allgather) or `STEP <ms>...`
(mode resnet) like bench-round-worker.

allgather: per forward, what SyncBatchNorm sends on a non-NCCL backend:
  cat([mean, invstd, count]) (2C+1 fp32), all_gather into a list, stack.
resnet: per step, that all_gather for each of the 53 ResNet-50 BN layers in
  order, then all_reduce(cat([sum_dy, sum_dy_xmu])) in reverse order.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import resnet50  # noqa: E402


def forward_collective(world, mean, invstd, count):
    import torch
    import torch.distributed as dist
    combined = torch.cat([mean, invstd, count], dim=0)
    gathered = [torch.empty_like(combined) for _ in range(world)]
    dist.all_gather(gathered, combined)
    return torch.stack(gathered, dim=0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="allgather")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--channels", default="64")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args()
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port,
                            rank=a.rank, world_size=a.world)
    torch.manual_seed(a.rank)
    if a.mode == "allgather":
        for c in [int(x) for x in a.channels.split(",")]:
            mean, invstd = torch.rand(c), torch.rand(c)
            count = torch.full((1,), 1024.0)
            lat = []
            for s in range(a.warmup + a.rounds):
                t0 = time.perf_counter()
                forward_collective(a.world, mean, invstd, count)
                if s >= a.warmup:
                    lat.append((time.perf_counter() - t0) * 1e6)
            print("LAT %d %s" % (c, " ".join("%.1f" % v for v in lat)), flush=True)
    else:
        layers = resnet50.bn_layers()
        stats = [(torch.rand(c), torch.rand(c), torch.full((1,), 32.0 * h * h))
                 for _, c, h in layers]
        sums = [(torch.rand(c), torch.rand(c)) for _, c, _ in layers]
        ms = []
        for s in range(a.warmup + a.rounds):
            t0 = time.perf_counter()
            for mean, invstd, count in stats:
                forward_collective(a.world, mean, invstd, count)
            for sum_dy, sum_dy_xmu in reversed(sums):
                combined = torch.cat([sum_dy, sum_dy_xmu], dim=0)
                dist.all_reduce(combined, dist.ReduceOp.SUM)
            if s >= a.warmup:
                ms.append((time.perf_counter() - t0) * 1e3)
        print("STEP %s" % " ".join("%.3f" % v for v in ms), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
