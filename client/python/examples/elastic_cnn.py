#!/usr/bin/python3
"""A small CNN trains while its ranks come and go: an elastic syncnorm job.

    /usr/bin/python3 client/python/examples/elastic_cnn.py --phase=25

or, without installing the package,

    bazel run //client/python:elastic_cnn -- --phase=25

The job's rank space is 6 and ranks 0-3 are its members as created
(attach(members=[0, 1, 2, 3])). In phases of --phase steps each:

  phase 0  ranks 0, 1, 2, 3 train (4 ranks);
  phase 1  rank 3 leaves gracefully (Session.leave() after its last step),
           ranks 0, 1, 2 go on (3 ranks);
  phase 2  rank 2 is killed (SIGKILL, by this launcher) after its last
           step of phase 1; the launcher, as an operator would, removes it
           (Client.update_membership(remove=[2])) and ranks 0, 1 go on;
  phase 3  ranks 3 (a new process), 4 and 5 attach: not members, they join
           at the job's next step, load the service's running statistics
           and start their layers' step counters there (5 ranks).

Joining needs a step boundary the joiners can meet: ranks 0 and 1 wait
before the first step of phase 3 until the joiners have attached (as a
torchrun rendezvous would hold them); the launcher and the workers meet
through marker files in a scratch folder.

Each worker draws its own, uneven batch (batch + rank % 3 - 1 images);
parameter gradients stay local (a trainer with changing members averages
them with its own collective; this example is about the BN statistics).
With --record DIR every worker saves each BN layer's input of each step
(DIR/r<rank>-s<step>.npz) and its buffers when it attached, left and
ended, and the launcher writes DIR/summary.json (the membership history
and the aggregator's final statistics), from which
client/python/tests/elastic_test.py replays the run in float64.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import train_cnn  # noqa: E402  the data and the aggregator's launch

RANK_SPACE = 6
FIRST_MEMBERS = (0, 1, 2, 3)
LEAVER, KILLED, STAYING = 3, 2, (0, 1)
JOINERS = (3, 4, 5)


def plan(phase):
    """The run's membership by step: a list of (first step, members)."""
    return [(0, [0, 1, 2, 3]), (phase, [0, 1, 2]), (2 * phase, [0, 1]),
            (3 * phase, [0, 1, 3, 4, 5])]


# ---- the worker -----------------------------------------------------------


def make_model():
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, 16, bias=False), nn.BatchNorm1d(16),
        nn.ReLU(inplace=True), nn.Linear(16, 10))


def wait_for(path, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit("waited %.0f s for %s" % (timeout, path))
        time.sleep(0.01)


def touch(path):
    with open(path + ".tmp", "w"):
        pass
    os.replace(path + ".tmp", path)


def save_buffers(session, path):
    import numpy as np
    np.savez(path, **{
        "%d_%s" % (i, name): getattr(bn, name).detach().double().numpy()
        for i, bn in enumerate(session.layers)
        for name in ("running_mean", "running_var", "num_batches_tracked")})


def worker(args):
    import numpy as np
    import torch
    import torch.nn.functional as F

    import syncnorm.torch as snt

    torch.set_num_threads(1)
    rank, marks, tag = args.rank, args.markers, args.tag
    if args.role == "joiner":
        wait_for(os.path.join(marks, "go.join"))
    torch.manual_seed(0)  # every rank starts from the same weights
    model = snt.convert_sync_batchnorm(make_model())
    session = snt.attach(model, args.address, job_id=args.job_id, rank=rank,
                         world_size=RANK_SPACE, members=list(FIRST_MEMBERS))
    print("rank %d attached at step %d%s" % (
        rank, session.first_step, " (joined)" if session.joined else ""),
        flush=True)
    if args.record:
        save_buffers(session, os.path.join(
            args.record, "%s-attached.npz" % tag))
        inputs = {}
        for i, bn in enumerate(session.layers):
            bn.register_forward_pre_hook(
                lambda m, a, i=i: inputs.__setitem__(
                    i, a[0].detach().numpy().copy()))
    touch(os.path.join(marks, "%s.attached" % tag))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = train_cnn.Synthetic()
    local_batch = max(1, args.batch + rank % 3 - 1)
    for step in range(session.first_step, args.steps):
        if step == args.pause_before:
            wait_for(os.path.join(marks, "go.step%d" % step))
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, labels = data.batch(local_batch, g)
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.record:
            np.savez(os.path.join(args.record, "r%d-s%d.npz" % (rank, step)),
                     **{str(i): x for i, x in inputs.items()})
        touch(os.path.join(marks, "r%d.step%d" % (rank, step)))
        if rank == 0:
            print("step %3d  loss %.4f  members %d" % (
                step, loss.item(), len(members_at(args.phase, step))),
                flush=True)
        if step == args.leave_after:
            info = session.leave()
            if args.record:
                save_buffers(session, os.path.join(
                    args.record, "%s-left.npz" % tag))
            print("rank %d left from step %d; members now %s" % (
                rank, step + 1, info["membership"]["members"]), flush=True)
            return 0
        if step == args.die_after:
            time.sleep(600)  # the launcher kills it
    if args.record:
        save_buffers(session, os.path.join(args.record, "%s-final.npz" % tag))
    return 0


def members_at(phase, step):
    members = []
    for first, ranks in plan(phase):
        if step >= first:
            members = ranks
    return members


# ---- the launcher ---------------------------------------------------------


def start(args, rank, role, **steps):
    """Worker `rank` as a member of the job as created ("r<rank>") or a
    joiner ("j<rank>")."""
    tag = ("r" if role == "member" else "j") + str(rank)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker",
           "--rank=%d" % rank, "--role=" + role, "--tag=" + tag, "--address=" + args.address,
           "--job_id=" + args.job_id, "--markers=" + args.markers,
           "--phase=%d" % args.phase, "--steps=%d" % (4 * args.phase),
           "--batch=%d" % args.batch, "--lr=%g" % args.lr,
           "--record=" + args.record]
    cmd += ["--%s=%d" % (k, v) for k, v in steps.items()]
    return subprocess.Popen(cmd)


def orchestrate(args):
    """Runs the plan against args.address; returns the summary."""
    import syncnorm
    client = syncnorm.Client(args.address)
    p = args.phase
    procs = {
        "r0": start(args, 0, "member", pause_before=3 * p),
        "r1": start(args, 1, "member", pause_before=3 * p),
        "r2": start(args, 2, "member", die_after=2 * p - 1),
        "r3": start(args, 3, "member", leave_after=p - 1),
    }
    for rank in JOINERS:
        procs["j%d" % rank] = start(args, rank, "joiner")
    try:
        return run_plan(args, client, procs)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def run_plan(args, client, procs):
    p = args.phase

    def mark(name):
        return os.path.join(args.markers, name)

    def wait_for(path, timeout=300.0):
        """As the workers' wait_for, but a worker that fails ends it."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            for name, proc in procs.items():
                code = proc.poll()
                if code not in (None, 0) and name != "r%d" % KILLED:
                    sys.exit("worker %s exited with %s while the launcher "
                             "waited for %s" % (name, code,
                                                os.path.basename(path)))
            if time.monotonic() > deadline:
                sys.exit("waited %.0f s for %s" % (timeout, path))
            time.sleep(0.01)
    # Phase 2: rank 2 is gone after its last step; the operator removes it
    # from the next step, so that the rounds waiting for it go on.
    wait_for(mark("r%d.step%d" % (KILLED, 2 * p - 1)))
    procs["r2"].send_signal(signal.SIGKILL)
    removed = client.update_membership(args.job_id, remove=[KILLED])
    print("rank %d killed and removed from step %d" % (
        KILLED, removed["membership"]["history"][-1]["step"]), flush=True)
    # Phase 3: ranks 0 and 1 wait at its first step while the joiners
    # attach (each joins at the job's next step, the same for all).
    for rank in STAYING:
        wait_for(mark("r%d.step%d" % (rank, 3 * p - 1)))
    touch(mark("go.join"))
    for rank in JOINERS:
        wait_for(mark("j%d.attached" % rank))
    touch(mark("go.step%d" % (3 * p)))
    codes = {name: proc.wait() for name, proc in procs.items()}
    job = client.get_job(args.job_id)
    stats = client.get_running_stats(args.job_id)
    return {"codes": codes, "job": job, "stats": stats, "plan": plan(p)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", type=int, default=25,
                        help="steps per phase (4 phases)")
    parser.add_argument("--batch", type=int, default=8,
                        help="images per worker (rank r takes "
                             "batch + r %% 3 - 1)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--address", default="",
                        help="a running aggregator; default: start one")
    parser.add_argument("--aggregator", default="",
                        help="the aggregator binary to start")
    parser.add_argument("--job_id", default="")
    parser.add_argument("--record", default="",
                        help="a folder for every BN input and buffer "
                             "(for the float64 replay)")
    parser.add_argument("--worker", action="store_true",
                        help=argparse.SUPPRESS)
    for name in ("rank", "steps", "pause_before", "leave_after",
                 "die_after"):
        parser.add_argument("--" + name, type=int, default=-1,
                            help=argparse.SUPPRESS)
    parser.add_argument("--role", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    parser.add_argument("--markers", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.exit(worker(args))
    if args.phase < 1:
        sys.exit("--phase must be at least 1, got %d" % args.phase)
    args.job_id = args.job_id or "elastic-cnn-" + uuid.uuid4().hex[:8]
    aggregator = scratch = None
    if not args.address:
        aggregator, args.address, scratch = train_cnn.start_aggregator(args)
    args.markers = tempfile.mkdtemp(prefix="elastic-cnn-")
    try:
        summary = orchestrate(args)
    finally:
        shutil.rmtree(args.markers, ignore_errors=True)
        if aggregator is not None:
            aggregator.terminate()
            aggregator.wait()
            shutil.rmtree(scratch, ignore_errors=True)
    if args.record:
        with open(os.path.join(args.record, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    membership = summary["job"]["membership"]
    print("done: members %s (version %d); history %s" % (
        membership["members"], membership["version"],
        [(c["step"], c["members"]) for c in membership["history"]]),
        flush=True)
    expected = {name: 0 for name in summary["codes"]}
    expected["r2"] = -signal.SIGKILL
    if summary["codes"] != expected:
        sys.exit("workers exited with %s" % summary["codes"])


if __name__ == "__main__":
    main()
