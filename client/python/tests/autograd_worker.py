"""One rank of autograd_test: runs each scenario through syncnorm on its
shard of the global batch (autograd_cases) and saves what it got to
<out>/rank<r>.pt."""

import argparse
import os
import sys
import traceback

import torch

import autograd_cases as ac
import syncnorm
import syncnorm.torch as snt


def penalty(client, job, rank):
    """A gradient penalty (create_graph=True through a training layer)
    raises before its round; then the first-order backward of the same
    forward is still the step's one backward round."""
    model = snt.convert_sync_batchnorm(ac.model())
    snt.attach(model, client, job, rank, ac.WORLD_SIZE)
    x = ac.shard(ac.batch(), rank).requires_grad_()
    dy = ac.shard(ac.upstream(1), rank)
    out = model(x)
    error = ""
    try:
        (g,) = torch.autograd.grad((out * dy).sum(), x, create_graph=True)
        g.pow(2).sum().backward()
    except RuntimeError as e:
        error = str(e)
    model.zero_grad(set_to_none=True)
    x.grad = None
    (out * dy).sum().backward()
    return {"error": error, "dx": x.grad.clone(), "grads": ac.grads(model)}


def twice(client, job, rank):
    """Two backwards through one forward (retain_graph): the first is the
    step's backward round, the second raises before any round; then the
    next step runs."""
    model = snt.convert_sync_batchnorm(ac.model())
    snt.attach(model, client, job, rank, ac.WORLD_SIZE)
    x = ac.shard(ac.batch(), rank).requires_grad_()
    out = model(x)
    (out * ac.shard(ac.upstream(1), rank)).sum().backward(retain_graph=True)
    first = {"dx": x.grad.clone(), "grads": ac.grads(model)}
    error = ""
    try:
        (out * ac.shard(ac.upstream(2), rank)).sum().backward()
    except RuntimeError as e:
        error = str(e)
    model.zero_grad(set_to_none=True)
    x.grad = None
    model(x).sum().backward()  # the next step's rounds
    return {"first": first, "error": error}


SCENARIOS = {"penalty": penalty, "twice": twice}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    client = syncnorm.Client(args.address, round_timeout=60.0)
    results = {}
    for name, run in SCENARIOS.items():
        try:
            results[name] = run(client, "%s-%s" % (args.run_id, name),
                                args.rank)
        except Exception as e:  # recorded: the test says which and why
            traceback.print_exc()
            results[name] = {"failed": "%s: %s" % (type(e).__name__, e)}
    torch.save(results, os.path.join(args.out, "rank%d.pt" % args.rank))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
