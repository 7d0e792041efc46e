"""One rank of precise_bn_test: for each scenario of precise_bn_cases,
trains the model a few steps through syncnorm, runs precise_bn on its own
batches and saves what it saw before and after to
<out>/<scenario>-rank<r>.pt (each scenario as soon as it ends: the rank
that kills itself in the last one has saved the others)."""

import argparse
import os
import signal
import sys
import time
import traceback

import torch

import precise_bn_cases as cases
import syncnorm
import syncnorm.torch as snt


def state(model, session, client):
    """The layers' buffers (by module name), the job's statistics of the
    rank's group and the model's parameters."""
    stats = client.get_running_stats(session.job_id,
                                     group=session.group_index)
    service = {session.names[e["layer"]]: e for e in stats["layers"]}
    buffers = {name: (bn.running_mean.clone(), bn.running_var.clone(),
                      int(bn.num_batches_tracked))
               for name, bn in zip(session.names, session.layers)}
    params = {k: v.clone() for k, v in model.named_parameters()}
    return {"buffers": buffers, "service": service, "params": params}


def killing_forward(rank, batches):
    """forward_fn of the kill scenario: the killed rank dies at the first
    forward of the second layer's pass, before its merge."""
    calls = [0]

    def forward(model, batch):
        calls[0] += 1
        if rank == cases.KILL_RANK and calls[0] == len(batches) + 1:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return model(batch)

    return forward


def scenario(client, job, rank, name):
    one_pass, groups, timeout_ms = cases.SCENARIOS[name]
    model = snt.convert_sync_batchnorm(cases.Net())
    session = snt.attach(model, client, job, rank, cases.WORLD_SIZE,
                         groups=groups, round_timeout_ms=timeout_ms)
    model.train()
    for step in range(cases.TRAIN_STEPS):
        model(cases.train_batch(rank, step)).square().mean().backward()
    model.zero_grad(set_to_none=True)
    batches = cases.batches(name, rank)
    got = {"group": session.group_index, "before": state(model, session,
                                                           client),
           "state_dict": {k: v.clone() for k, v in model.state_dict().items()}}
    forward = killing_forward(rank, batches) if name == "kill" else None
    start = time.perf_counter()
    try:
        got["result"] = snt.precise_bn(model, batches, one_pass=one_pass,
                                       forward_fn=forward)
    except syncnorm.ServiceError as e:
        got["error"] = {"type": type(e).__name__, "code": e.code,
                        "text": str(e)}
    got["seconds"] = time.perf_counter() - start
    got["modes_restored"] = all(m.training for m in model.modules())
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        for x in batches:
            model(x)
    got["forward_seconds"] = time.perf_counter() - start
    got["after"] = state(model, session, client)
    prefix = job + ".precise-bn."
    got["scratch_jobs"] = sorted(j["job_id"] for j in client.list_jobs()
                                 if j["job_id"].startswith(prefix))
    return got


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    client = syncnorm.Client(args.address, round_timeout=60.0)
    for name in cases.SCENARIOS:
        try:
            got = scenario(client, "%s-%s" % (args.run_id, name), args.rank,
                           name)
        except Exception as e:  # recorded: the test says which and why
            traceback.print_exc()
            got = {"failed": "%s: %s" % (type(e).__name__, e)}
        torch.save(got, os.path.join(args.out, "%s-rank%d.pt" % (
            name, args.rank)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
