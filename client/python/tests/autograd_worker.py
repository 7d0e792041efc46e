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
    """Double backward through a training layer, per step: step 0 the
    gradient penalty alone, step 1 WGAN-GP's loss + 10 * penalty in one
    backward (a first-order backward and the penalty's double backward
    of one forward), step 2 a plain step after them."""
    model = snt.convert_sync_batchnorm(ac.model())
    snt.attach(model, client, job, rank, ac.WORLD_SIZE)
    dy = ac.shard(ac.upstream(1), rank)
    got = {}
    for mode in ac.PENALTY_MODES:
        model.zero_grad(set_to_none=True)
        x = ac.shard(ac.batch(), rank).requires_grad_()
        out = model(x)
        loss = (out * dy).sum()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        ac.penalty_loss(mode, loss, g).backward()
        got[mode] = {"dx": x.grad.clone(), "grads": ac.grads(model)}
    model.zero_grad(set_to_none=True)
    x = ac.shard(ac.batch(), rank).requires_grad_()
    (model(x) * dy).sum().backward()
    got["next"] = {"dx": x.grad.clone(), "grads": ac.grads(model)}
    return got


def several(client, job, rank):
    """Three backwards through one forward (retain_graph=True, as PCGrad
    runs one per task loss), each its own round: the gradients of each,
    taken apart; then the next step's forward and backward run."""
    model = snt.convert_sync_batchnorm(ac.model())
    snt.attach(model, client, job, rank, ac.WORLD_SIZE)
    x = ac.shard(ac.batch(), rank).requires_grad_()
    out = model(x)
    backwards = []
    for k, seed in enumerate(ac.SEEDS):
        model.zero_grad(set_to_none=True)
        x.grad = None
        loss = (out * ac.shard(ac.upstream(seed), rank)).sum()
        loss.backward(retain_graph=k + 1 < len(ac.SEEDS))
        backwards.append({"dx": x.grad.clone(), "grads": ac.grads(model)})
    model.zero_grad(set_to_none=True)
    x.grad = None
    model(x).sum().backward()  # the next step's rounds
    return {"backwards": backwards,
            "next": {"dx": x.grad.clone(), "grads": ac.grads(model)}}


def apex(client, job, rank):
    """The gradient penalty through apex's fused layer: channel_last input,
    a residual z and the ReLU fused in."""
    bn = snt.SyncBatchNorm(ac.CHANNELS, channel_last=True, fuse_relu=True)
    weight, bias = ac.apex_affine()
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    snt.attach(bn, client, job, rank, ac.WORLD_SIZE)
    x, z = (ac.shard(t, rank).requires_grad_() for t in ac.apex_inputs())
    out = bn(x, z)
    loss = (out * ac.shard(ac.apex_upstream(), rank)).sum()
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    ac.penalty_loss("gp", loss, g).backward()
    return {"dx": x.grad.clone(), "dz": z.grad.clone(),
            "grads": {"weight": bn.weight.grad.clone(),
                      "bias": bn.bias.grad.clone()}}


SCENARIOS = {"penalty": penalty, "several": several, "apex": apex}


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
