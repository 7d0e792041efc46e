"""One rank of stale_test: a model of two SyncBatchNorm layers on inputs
the test knows (data()), trained forward and backward (no optimizer, so
gamma and beta stay 1 and 0) in several jobs one after the other, each
"job_id:staleness:slow" (slow: this rank sleeps before every step when it
is the slow rank). Records every step's outputs, input gradients and views,
the buffers before and after state_dict(), the aggregator's statistics,
and the error a momentum change raises in a stale job. Saves them to
<out>/rank<r>.pt."""

import argparse
import os
import time

import torch
import torch.nn as nn

import syncnorm
import syncnorm.torch as snt

STEPS = 8
SLOW_RANK = 2
SLOW_SLEEP = 0.06
# Two layers: (channels, the input's trailing shape).
LAYERS = ((3, (5,)), (2, ()))


def data(rank, step, layer):
    """(x, dy) of `rank` at `step` for `layer`: float32, 4 + rank rows."""
    g = torch.Generator().manual_seed(100000 * layer + 1000 * rank + step)
    channels, rest = LAYERS[layer]
    shape = (4 + rank, channels) + rest
    x = torch.randn(shape, generator=g) * (1.0 + 0.2 * step) + rank - layer
    dy = torch.randn(shape, generator=g)
    return x, dy


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = snt.SyncBatchNorm(LAYERS[0][0])
        self.b = snt.SyncBatchNorm(LAYERS[1][0])

    def forward(self, xa, xb):
        return self.a(xa), self.b(xb)


def buffers(model):
    return [(bn.running_mean.clone(), bn.running_var.clone(),
             int(bn.num_batches_tracked)) for bn in (model.a, model.b)]


def run_job(client, job_id, staleness, slow, rank, world_size):
    torch.manual_seed(0)
    model = TwoLayers()
    session = snt.attach(model, client, job_id, rank, world_size,
                         round_timeout_ms=30000, staleness=staleness)
    steps = []
    for step in range(STEPS):
        if slow:
            time.sleep(SLOW_SLEEP)
        (xa, dya), (xb, dyb) = data(rank, step, 0), data(rank, step, 1)
        xa.requires_grad_()
        xb.requires_grad_()
        ya, yb = model(xa, xb)
        ((ya * dya).sum() + (yb * dyb).sum()).backward()
        steps.append({
            "y": [ya.detach(), yb.detach()],
            "dx": [xa.grad.detach(), xb.grad.detach()],
            "view": [session.last_view("a"), session.last_view(1)],
        })
    record = {"staleness": session.staleness, "steps": steps,
              "behind": [model.a._sn_behind, model.b._sn_behind],
              "buffers_before": buffers(model)}
    state = model.state_dict()
    record["state_dict"] = [
        (state[n + ".running_mean"], state[n + ".running_var"],
         int(state[n + ".num_batches_tracked"])) for n in ("a", "b")]
    record["buffers_after"] = buffers(model)
    record["server"] = client.get_running_stats(job_id)
    if staleness:
        model.a.momentum = 0.5
        try:
            model(*(data(rank, STEPS, layer)[0] for layer in range(2)))
            record["momentum_error"] = None
        except ValueError as e:
            record["momentum_error"] = str(e)
    return record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--jobs", required=True,
                        help="comma-separated job_id:staleness:slow")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world_size", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    client = syncnorm.Client(args.address, rpc_timeout=30, round_timeout=60)
    results = {}
    for spec in args.jobs.split(","):
        job_id, staleness, slow = spec.split(":")
        results[job_id] = run_job(
            client, job_id, int(staleness),
            slow == "slow" and args.rank == SLOW_RANK, args.rank,
            args.world_size)
    torch.save(results, os.path.join(args.out, "rank%d.pt" % args.rank))


if __name__ == "__main__":
    main()
