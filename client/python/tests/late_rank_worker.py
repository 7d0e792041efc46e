"""One rank of late_rank_test, written the way a torch user writes it: a
syncnorm.Client with a short round timeout, a model with SyncBatchNorm,
two training steps. A forward that fails is retried (the same step) until
it succeeds; each attempt's outcome and duration is recorded. Saves the
records to <out>/rank<r>.pt."""

import argparse
import os
import time

import torch
import torch.nn as nn

import syncnorm
import syncnorm.torch as snt

STEPS = 2
CHANNELS = 3


def data(rank):
    """This rank's inputs and output gradients, one pair per step."""
    g = torch.Generator().manual_seed(1000 + rank)
    n = 4 + rank
    return [(torch.randn(n, CHANNELS, 2, generator=g) * 2 + 1,
             torch.randn(n, CHANNELS, 2, generator=g)) for _ in range(STEPS)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--round_timeout", type=float, required=True)
    parser.add_argument("--round_timeout_ms", type=int, required=True)
    parser.add_argument("--give_up", type=float, default=60.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    client = syncnorm.Client(args.address, rpc_timeout=10,
                             round_timeout=args.round_timeout)
    time.sleep(args.delay)
    model = nn.Sequential(snt.SyncBatchNorm(CHANNELS))
    snt.attach(model, client, args.job, args.rank, 2,
               round_timeout_ms=args.round_timeout_ms)
    give_up = time.monotonic() + args.give_up
    attempts, ys, dxs = [], [], []
    for x, dy in data(args.rank):
        x = x.clone().requires_grad_()
        while True:
            start = time.monotonic()
            try:
                y = model(x)
            except syncnorm.ServiceError as e:
                attempts.append((e.code, time.monotonic() - start, str(e)))
                if time.monotonic() > give_up:
                    raise
                continue
            attempts.append(("OK", time.monotonic() - start, ""))
            break
        (y * dy).sum().backward()
        ys.append(y.detach())
        dxs.append(x.grad.detach())
    bn = model[0]
    torch.save({"attempts": attempts, "ys": ys, "dxs": dxs,
                "running_mean": bn.running_mean.clone(),
                "running_var": bn.running_var.clone(),
                "num_batches_tracked": int(bn.num_batches_tracked)},
               os.path.join(args.out, "rank%d.pt" % args.rank))


if __name__ == "__main__":
    main()
