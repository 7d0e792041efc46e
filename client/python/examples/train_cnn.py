#!/usr/bin/python3
"""W processes train a small CNN (7 BN layers) on synthetic data with
syncnorm's SyncBatchNorm; gradients are averaged by torch DDP over gloo.

    /usr/bin/python3 client/python/examples/train_cnn.py --workers=4 \
        --steps=300

or, without installing the package,

    bazel run //client/python:train_cnn -- --workers=4 --steps=300

Launched the way torch jobs are: by torchrun (--launcher=torchrun, the
default: `torchrun --standalone --nproc_per_node=W train_cnn.py --worker`),
or by this script setting torchrun's variables itself (--launcher=env:
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and
TORCHELASTIC_RUN_ID). Each worker calls init_process_group("gloo") (env://)
and attach(model) with no arguments: rank and world size come from
torch.distributed, the job id from TORCHELASTIC_RUN_ID and the aggregator
from SYNCNORM_ADDRESS. Without --address the launcher starts the
aggregator itself (--aggregator, $SYNCNORM_AGGREGATOR, Bazel's runfiles,
the installed package's or bazel-bin) on a free loopback port and exports
SYNCNORM_ADDRESS.

--staleness=tau makes the job stale-synchronous and --slow_rank=r
--slow_ms=t makes rank r a straggler. DDP's gradient all-reduce still
holds the ranks within a step of each other, so staleness changes which
statistics each forward normalizes with (views up to tau steps old), not
the step rate.

Each worker draws its own, uneven batch (batch + rank % 3 - 1 images) from
the same 10-class synthetic distribution; rank 0 logs the loss, accuracy,
step time and the time spent in syncnorm's forward and backward syncs, and
at the end the eval accuracy and how far its running statistics are from
the aggregator's.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the worker -----------------------------------------------------------


def make_model():
    import torch.nn as nn

    def conv_bn(cin, cout, stride):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *conv_bn(3, 16, 1), *conv_bn(16, 16, 1),
        *conv_bn(16, 32, 2), *conv_bn(32, 32, 1),
        *conv_bn(32, 64, 2), *conv_bn(64, 64, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 64, bias=False), nn.BatchNorm1d(64),
        nn.ReLU(inplace=True), nn.Linear(64, 10))


class Synthetic:
    """10 classes, each a fixed smooth 3x16x16 template plus noise and a
    random brightness shift."""

    def __init__(self, seed=0):
        import torch
        import torch.nn.functional as F
        g = torch.Generator().manual_seed(seed)
        coarse = torch.randn(10, 3, 4, 4, generator=g)
        self.templates = F.interpolate(coarse, size=(16, 16),
                                       mode="bilinear", align_corners=False)

    def batch(self, n, generator):
        import torch
        labels = torch.randint(0, 10, (n,), generator=generator)
        x = self.templates[labels] * 0.3 + torch.randn(
            n, 3, 16, 16, generator=generator)
        x = x + torch.randn(n, 1, 1, 1, generator=generator)
        return x, labels


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import syncnorm.torch as snt

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://, as torchrun sets it up
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # every rank starts from the same weights
    model = snt.convert_sync_batchnorm(make_model())   # the one-line swap
    # rank, world, job and address from the env
    session = snt.attach(model, staleness=args.staleness)
    client = session.client
    # syncnorm keeps the buffers equal on every rank: no buffer broadcast.
    ddp = DDP(model, broadcast_buffers=False)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9,
                                weight_decay=1e-4)
    data = Synthetic()
    g = torch.Generator().manual_seed(1000 + rank)
    local_batch = max(1, args.batch + rank % 3 - 1)
    log = rank == 0
    if log:
        print("%d workers, %d BN layers synced through %s (job %s), "
              "batch %s" % (world, len(session.layers), client.address,
                            session.job_id,
                            [max(1, args.batch + r % 3 - 1)
                             for r in range(world)]), flush=True)
    window = {"loss": 0.0, "correct": 0, "seen": 0, "time": 0.0,
              "sync": 0.0, "steps": 0}
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, labels = data.batch(local_batch, g)
        t0 = time.perf_counter()
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000.0)  # a straggler
        sync0 = session.sync_seconds
        logits = ddp(x)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        window["time"] += time.perf_counter() - t0
        window["sync"] += session.sync_seconds - sync0
        window["loss"] += loss.item()
        window["correct"] += int((logits.argmax(1) == labels).sum())
        window["seen"] += len(labels)
        window["steps"] += 1
        if log and (step % args.log_every == 0 or step == args.steps):
            n = window["steps"]
            print("step %4d  loss %.4f  acc %.3f  step %.1f ms  "
                  "sync %.1f ms/step (%d rounds)" % (
                      step, window["loss"] / n,
                      window["correct"] / window["seen"],
                      1e3 * window["time"] / n, 1e3 * window["sync"] / n,
                      2 * len(session.layers)), flush=True)
            window = dict.fromkeys(window, 0)
            window["loss"] = 0.0
    elapsed = time.perf_counter() - start
    # In a stale-synchronous job the first eval forward loads the
    # aggregator's statistics once every rank has finished these steps.
    model.eval()
    eval_g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        x, labels = data.batch(512, eval_g)
        acc = float((model(x).argmax(1) == labels).float().mean())
    stats = client.get_running_stats(session.job_id,
                                     group=session.group_index)
    drift = 0.0
    for entry in stats["layers"]:
        bn = session.layers[entry["layer"]]
        drift = max(drift, (bn.running_mean.double() - torch.tensor(
            entry["running_mean"])).abs().max().item(),
            (bn.running_var.double() - torch.tensor(
                entry["running_var"])).abs().max().item())
    if log:
        with torch.no_grad():
            eval_loss = float(F.cross_entropy(model(x), labels))
        print("done: %d steps in %.1f s; eval accuracy %.3f, loss %.4f "
              "(plain BN on the running statistics, no rounds); running "
              "statistics vs the aggregator: max |diff| %.1e" % (
                  args.steps, elapsed, acc, eval_loss, drift), flush=True)
    dist.destroy_process_group()
    return 0


# ---- the launcher ---------------------------------------------------------


def packaged_aggregator():
    """The aggregator of the installed syncnorm package (pip install)."""
    try:
        from syncnorm import aggregator
    except ImportError:
        return None
    return aggregator.BINARY


def find_aggregator(args):
    runfiles = [os.path.join(os.environ[v], "syncnorm", "server",
                             "syncnorm-aggregator")
                for v in ("RUNFILES_DIR", "PYTHON_RUNFILES")
                if os.environ.get(v)]
    for path in [args.aggregator, os.environ.get("SYNCNORM_AGGREGATOR")] + \
            runfiles + [packaged_aggregator(),
                        os.path.join(REPO, "server", "syncnorm-aggregator"),
                        os.path.join(REPO, "bazel-bin", "server",
                                     "syncnorm-aggregator")]:
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("no aggregator binary: pip install the syncnorm package, or "
             "run `bazel build //server:syncnorm-aggregator`, or pass "
             "--aggregator or --address")


def start_aggregator(args):
    scratch = tempfile.mkdtemp(prefix="train-cnn-")
    port_file = os.path.join(scratch, "port")
    proc = subprocess.Popen([find_aggregator(args), "--listen=127.0.0.1:0",
                             "--port_file=" + port_file,
                             "--data_dir=" + os.path.join(scratch, "data")],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(port_file):
            with open(port_file) as f:
                port = f.read().strip()
            if port:
                return proc, "127.0.0.1:" + port, scratch
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    shutil.rmtree(scratch, ignore_errors=True)
    sys.exit("the aggregator did not start")


def launch(args):
    aggregator = None
    scratch = None
    if not args.address:
        aggregator, args.address, scratch = start_aggregator(args)
    try:
        codes = run_workers(args)
    finally:
        if aggregator is not None:
            aggregator.terminate()
            aggregator.wait()
            shutil.rmtree(scratch, ignore_errors=True)
    if any(codes):
        sys.exit("workers exited with %s" % codes)


def run_workers(args):
    """Runs the workers against args.address; returns their exit codes."""
    env = dict(os.environ, SYNCNORM_ADDRESS=args.address)
    script = [os.path.abspath(__file__), "--worker",
              "--steps=%d" % args.steps, "--batch=%d" % args.batch,
              "--lr=%g" % args.lr, "--log_every=%d" % args.log_every,
              "--staleness=%d" % args.staleness,
              "--slow_rank=%d" % args.slow_rank,
              "--slow_ms=%g" % args.slow_ms]
    if args.launcher == "torchrun":
        # --standalone: a local rendezvous and a fresh run id
        # (TORCHELASTIC_RUN_ID, the job id) for each run. --redirects=1
        # --tee=1 (stdout through a log file to the console): torch 1.13
        # on Python 3.11 cannot parse the default, 0.
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=%d" % args.workers, "--redirects=1",
               "--tee=1"] + script
        procs = [subprocess.Popen(cmd, env=env)]
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   WORLD_SIZE=str(args.workers),
                   TORCHELASTIC_RUN_ID=args.job_id or
                   "train-cnn-" + uuid.uuid4().hex[:8])
        procs = [subprocess.Popen([sys.executable] + script,
                                  env=dict(env, RANK=str(r),
                                           LOCAL_RANK=str(r)))
                 for r in range(args.workers)]
    return [p.wait() for p in procs]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16,
                        help="images per worker (rank r takes "
                             "batch + r %% 3 - 1)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log_every", type=int, default=25)
    parser.add_argument("--address", default="",
                        help="a running aggregator; default: start one")
    parser.add_argument("--aggregator", default="",
                        help="the aggregator binary to start")
    parser.add_argument("--launcher", choices=("torchrun", "env"),
                        default="torchrun",
                        help="torchrun, or this script setting torchrun's "
                             "variables for each worker process")
    parser.add_argument("--job_id", default="",
                        help="with --launcher=env: the job id "
                             "(TORCHELASTIC_RUN_ID); default: a fresh one")
    parser.add_argument("--staleness", type=int, default=0,
                        help="the job's staleness bound tau (0: "
                             "synchronous); a rank's forward merges what "
                             "the others sent within tau steps")
    parser.add_argument("--slow_rank", type=int, default=-1,
                        help="this rank sleeps --slow_ms before every step "
                             "(a straggler); -1: none")
    parser.add_argument("--slow_ms", type=float, default=0.0)
    parser.add_argument("--worker", action="store_true",
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.exit(worker(args))
    launch(args)


if __name__ == "__main__":
    main()
