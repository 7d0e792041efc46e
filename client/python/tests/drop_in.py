"""What torch users do with torch.nn.SyncBatchNorm, done with syncnorm's on
W worker processes that run torch.distributed (gloo, env://), against
torch's BatchNorm in float64 on the concatenated batch of each group.

Each scenario has a worker part (run_<name>, in every worker process, its
records saved) and a check (check_<name>, in the test process: the torch
reference and the comparison). Data of a step is generated from the
scenario's seed, so the workers and the reference see the same values;
rank r takes rows [offset_r, offset_r + shards[r]).

torch 1.13's own SyncBatchNorm needs CUDA tensors for its forward, so the
reference is torch's BatchNorm on the concatenated batch of the group's
ranks (what SyncBatchNorm computes), in float64.
"""

import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import cases
import harness
import syncnorm
import syncnorm.torch as snt

WORLD_SIZE = 4
CHANNELS = 3
SHARDS = [3, 5, 2, 4]
ROUND_TIMEOUT_MS = 10000


# ---- data and models --------------------------------------------------------


def offsets(shards):
    out, start = [], 0
    for n in shards:
        out.append(start)
        start += n
    return out


def global_batch(seed, step, shards=SHARDS, spatial=(2, 3), shift=None):
    """(x, r) of the whole world in float64, x rounded to float32; with
    `shift`, rank k's rows are moved by shift * k (groups then differ)."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    shape = (sum(shards), CHANNELS) + tuple(spatial)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1)
    if shift:
        for k, (lo, n) in enumerate(zip(offsets(shards), shards)):
            x[lo:lo + n] += shift * k
    x = x.float().double()
    r = torch.randn(shape, generator=g, dtype=torch.float64).float().double()
    return x, r


def rows(t, rank, shards=SHARDS):
    lo = offsets(shards)[rank]
    return t[lo:lo + shards[rank]]


def group_rows(t, ranks, shards=SHARDS):
    return torch.cat([rows(t, k, shards) for k in ranks])


def initial(seed):
    """gamma, beta, running mean, running var of two layers."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(CHANNELS, generator=g) + 0.5,
             torch.randn(CHANNELS, generator=g) * 0.5,
             torch.randn(CHANNELS, generator=g) * 0.3,
             torch.rand(CHANNELS, generator=g) + 0.5) for _ in range(2)]


def torch_model(seed, momentum=0.1):
    layers = []
    for gamma, beta, mean, var in initial(seed):
        bn = nn.BatchNorm2d(CHANNELS, momentum=momentum).double()
        with torch.no_grad():
            bn.weight.copy_(gamma)
            bn.bias.copy_(beta)
            bn.running_mean.copy_(mean)
            bn.running_var.copy_(var)
        layers.append(bn)
    return cases.TwoBN(*layers)


def sync_model(seed, process_group=None, **kw):
    """torch_model's, in float32, through convert_sync_batchnorm (the
    one-line swap of a torch user)."""
    return snt.convert_sync_batchnorm(torch_model(seed).float(),
                                      process_group, **kw)


def bns(model):
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def buffers(model):
    """[(mean, var, num_batches_tracked)] of each BN layer, float64."""
    return [(bn.running_mean.detach().double().clone(),
             bn.running_var.detach().double().clone(),
             int(bn.num_batches_tracked)) for bn in bns(model)]


def service_stats(session):
    """The aggregator's statistics of the session's group, as buffers()."""
    stats = session.client.get_running_stats(session.job_id,
                                             group=session.group_index)
    return [(torch.tensor(l["running_mean"], dtype=torch.float64),
             torch.tensor(l["running_var"], dtype=torch.float64),
             l["num_batches_tracked"]) for l in stats["layers"]]


def grads(model):
    return {n: (p.grad.detach().double().clone() if p.grad is not None
                else torch.zeros_like(p, dtype=torch.float64))
            for n, p in model.named_parameters()}


class Context:
    """A worker's rank, its client and the run's id."""

    def __init__(self, rank, client, run_id):
        self.rank = rank
        self.client = client
        self.run_id = run_id

    def attach(self, model, name, **kw):
        """attach() with explicit arguments (also valid before this
        change's defaults)."""
        return snt.attach(model, self.client, "%s-%s" % (self.run_id, name),
                          self.rank, WORLD_SIZE,
                          round_timeout_ms=ROUND_TIMEOUT_MS, **kw)


def train_step(model, x, r):
    """One forward and backward of the rank's rows; the step's records."""
    x = x.float().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    y = model(x)
    (y * r.float()).sum().backward()
    return {"y": y.detach().double(), "dx": x.grad.double(),
            "grads": grads(model)}


def reference_step(model, x, r):
    x = x.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    y = model(x)
    (y * r).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "grads": grads(model)}


# ---- comparison -------------------------------------------------------------


class Errors:
    """The worst relative error per quantity, and what cannot be measured
    as one (a different counter, a missing record)."""

    def __init__(self):
        self.worst = {}
        self.problems = []

    def note(self, what, actual, expected, floor=0.0):
        err = harness.rel_error(actual, expected, floor)
        self.worst[what] = max(self.worst.get(what, 0.0), err)

    def expect(self, ok, message):
        if not ok:
            self.problems.append(message)

    def stats(self, what, got, want):
        """Running statistics [(mean, var, n)] against the reference's."""
        self.expect(len(got) == len(want), "%s: %d layers, torch %d"
                    % (what, len(got), len(want)))
        for (m, v, n), (em, ev, en) in zip(got, want):
            self.note(what + " mean", m, em)
            self.note(what + " var", v, ev)
            self.expect(n == en, "%s num_batches_tracked %d, torch %d"
                        % (what, n, en))

    def step(self, what, got, want, ranks, shards=SHARDS, grads=True):
        """A step's outputs and input gradients of `ranks` against the
        reference on their concatenated rows; weight and bias gradients
        averaged over `ranks` (as DDP over the group would)."""
        for i, k in enumerate(ranks):
            lo = sum(shards[j] for j in ranks[:i])
            hi = lo + shards[k]
            for key in ("y", "dx"):
                self.note("%s %s" % (what, key), got[k][key],
                          want[key][lo:hi])
        if not grads:
            return
        for name, g in want["grads"].items():
            avg = sum(got[k]["grads"][name] for k in ranks) / len(ranks)
            self.note("%s grad %s" % (what, name.rsplit(".", 1)[-1]), avg,
                      g / len(ranks), floor=1e-12)


def reraise(records):
    """A worker's failure, as the scenario's error."""
    for r, rec in enumerate(records):
        if "error" in rec:
            raise AssertionError("rank %d failed: %s" % (r, rec["error"]))


# ---- 1. process_group membership ---------------------------------------------


def run_groups(ctx, name, groups, seed):
    import torch.distributed as dist
    handles = [dist.new_group(g) for g in groups]  # every rank, same order
    mine = [h for g, h in zip(groups, handles) if ctx.rank in g][0]
    model = sync_model(seed, process_group=mine)
    session = ctx.attach(model, name)
    out = {"group_ranks": list(getattr(session, "group_ranks", ())),
           "steps": []}
    for step in range(3):
        x, r = global_batch(seed, step, shift=3.0)
        rec = train_step(model, rows(x, ctx.rank), rows(r, ctx.rank))
        rec["buffers"] = buffers(model)
        rec["service"] = service_stats(session)
        out["steps"].append(rec)
    return out


def check_groups(records, groups, seed):
    reraise(records)
    e = Errors()
    for g in groups:
        model = torch_model(seed)
        for step in range(3):
            x, r = global_batch(seed, step, shift=3.0)
            want = reference_step(model, group_rows(x, g), group_rows(r, g))
            got = [rec["steps"][step] for rec in records]
            e.step("step %d" % step, got, want, g)
            for k in g:
                e.stats("buffers", got[k]["buffers"], buffers(model))
                e.stats("service", got[k]["service"], buffers(model))
        for k in g:
            e.expect(records[k]["group_ranks"] == sorted(g),
                     "rank %d's group is %s, torch's %s"
                     % (k, records[k]["group_ranks"], sorted(g)))
    return e


# ---- 2. changes to the module after attach ----------------------------------


def run_momentum(ctx, seed=41):
    model = sync_model(seed)
    ctx.attach(model, "momentum")
    session = model.bn1._sn_session
    out = []
    # apex's test sets momentum = 1.0 after building the model; then 0.3;
    # then None (torch's cumulative average).
    for step, momentum in enumerate([1.0, 1.0, 0.3, None]):
        for bn in bns(model):
            bn.momentum = momentum
        x, r = global_batch(seed, step)
        rec = train_step(model, rows(x, ctx.rank), rows(r, ctx.rank))
        rec["buffers"] = buffers(model)
        rec["service"] = service_stats(session)
        out.append(rec)
    return out


def check_momentum(records, seed=41):
    reraise(records)
    e = Errors()
    model = torch_model(seed)
    everyone = list(range(WORLD_SIZE))
    for step, momentum in enumerate([1.0, 1.0, 0.3, None]):
        for bn in bns(model):
            bn.momentum = momentum
        x, r = global_batch(seed, step)
        want = reference_step(model, x, r)
        e.step("step %d" % step, [rec[step] for rec in records], want,
               everyone)
        for rec in records:
            e.stats("buffers", rec[step]["buffers"], buffers(model))
            e.stats("service", rec[step]["service"], buffers(model))
    return e


def update_bn_loader(seed, rank=None):
    """Three batches; the rank's rows of them (all rows for None)."""
    batches = [global_batch(seed, 100 + i)[0] for i in range(3)]
    if rank is None:
        return batches
    return [rows(b, rank).float() for b in batches]


def run_update_bn(ctx, seed=42):
    model = sync_model(seed)
    ctx.attach(model, "update-bn")
    session = model.bn1._sn_session
    for step in range(2):
        x, r = global_batch(seed, step)
        train_step(model, rows(x, ctx.rank), rows(r, ctx.rank))
    torch.optim.swa_utils.update_bn(update_bn_loader(seed, ctx.rank), model)
    out = {"after_update_bn": buffers(model),
           "service_after_update_bn": service_stats(session),
           "momentum": [bn.momentum for bn in bns(model)],
           "training": model.training}
    x, r = global_batch(seed, 2)
    out["step"] = train_step(model, rows(x, ctx.rank), rows(r, ctx.rank))
    out["buffers"] = buffers(model)
    out["service"] = service_stats(session)
    return out


def check_update_bn(records, seed=42):
    reraise(records)
    e = Errors()
    model = torch_model(seed)
    for step in range(2):
        x, r = global_batch(seed, step)
        reference_step(model, x, r)
    torch.optim.swa_utils.update_bn(update_bn_loader(seed), model)
    for rec in records:
        e.stats("after update_bn: buffers", rec["after_update_bn"],
                buffers(model))
        e.stats("after update_bn: service", rec["service_after_update_bn"],
                buffers(model))
        e.expect(rec["momentum"] == [0.1, 0.1] and rec["training"],
                 "update_bn did not restore momentum and mode: %s, %s"
                 % (rec["momentum"], rec["training"]))
    x, r = global_batch(seed, 2)
    want = reference_step(model, x, r)
    e.step("after update_bn, step", [rec["step"] for rec in records], want,
           list(range(WORLD_SIZE)))
    for rec in records:
        e.stats("buffers", rec["buffers"], buffers(model))
        e.stats("service", rec["service"], buffers(model))
    return e


def loaded_state(seed=43):
    """A state_dict for the two layers (a checkpoint of another run)."""
    g = torch.Generator().manual_seed(seed + 500)
    state = {}
    for i in (1, 2):
        state["bn%d.weight" % i] = torch.rand(CHANNELS, generator=g) + 0.5
        state["bn%d.bias" % i] = torch.randn(CHANNELS, generator=g)
        state["bn%d.running_mean" % i] = torch.randn(CHANNELS, generator=g)
        state["bn%d.running_var" % i] = torch.rand(CHANNELS, generator=g) + 1
        state["bn%d.num_batches_tracked" % i] = torch.tensor(11 * i)
    return state


def change_buffers(model, step):
    """What a trainer does to the buffers before `step`."""
    if step == 1:
        for bn in bns(model):
            bn.reset_running_stats()
    elif step == 2:
        model.load_state_dict(loaded_state())
    elif step == 3:
        with torch.no_grad():
            model.bn1.running_mean.mul_(0.5)
            model.bn2.running_var.fill_(2.0)
            model.bn1.num_batches_tracked.fill_(7)


def run_buffers(ctx, seed=44):
    model = sync_model(seed)
    ctx.attach(model, "buffers")
    session = model.bn1._sn_session
    out = []
    for step in range(4):
        change_buffers(model, step)
        x, r = global_batch(seed, step)
        rec = train_step(model, rows(x, ctx.rank), rows(r, ctx.rank))
        rec["buffers"] = buffers(model)
        rec["service"] = service_stats(session)
        out.append(rec)
    model.eval()
    with torch.no_grad():
        out.append(model(rows(global_batch(seed, 9)[0], ctx.rank).float()))
    return out


def check_buffers(records, seed=44):
    reraise(records)
    e = Errors()
    model = torch_model(seed)
    everyone = list(range(WORLD_SIZE))
    for step in range(4):
        change_buffers(model, step)
        x, r = global_batch(seed, step)
        want = reference_step(model, x, r)
        e.step("step %d" % step, [rec[step] for rec in records], want,
               everyone)
        for rec in records:
            e.stats("step %d buffers" % step, rec[step]["buffers"],
                    buffers(model))
            e.stats("step %d service" % step, rec[step]["service"],
                    buffers(model))
    model.eval()
    with torch.no_grad():
        y = model(global_batch(seed, 9)[0])
    for k, rec in enumerate(records):
        e.note("eval", rec[4], rows(y, k))
    return e


# ---- 3. a model reloaded mid-training ---------------------------------------


LR = 0.05


def sgd(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-LR)


def run_reload(ctx, seed=45):
    """torch's DDP SyncBatchNorm test: DDP, save the model after step 2,
    load it and keep training."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = sync_model(seed)
    ctx.attach(model, "reload")
    ddp = DDP(model)
    out = []
    for step in range(5):
        if step == 3:
            path = os.path.join(tempfile.mkdtemp(), "model.pt")
            torch.save(ddp, path)
            ddp = torch.load(path)
            ctx.attach(ddp.module, "reload")  # the same job
        x, r = global_batch(seed, step)
        xr = rows(x, ctx.rank).float().requires_grad_(True)
        ddp.zero_grad(set_to_none=True)
        y = ddp(xr)
        (y * rows(r, ctx.rank).float()).sum().backward()
        sgd(ddp.module)
        out.append({"y": y.detach().double(), "dx": xr.grad.double(),
                    "params": {n: p.detach().double().clone()
                               for n, p in ddp.module.named_parameters()},
                    "buffers": buffers(ddp.module),
                    "service": service_stats(ddp.module.bn1._sn_session)})
    return out


def check_reload(records, seed=45):
    reraise(records)
    e = Errors()
    model = torch_model(seed)
    for step in range(5):
        x, r = global_batch(seed, step)
        # DDP averages every rank's gradient: the whole batch's / W.
        want = reference_step(model, x, r / WORLD_SIZE)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
        for k, rec in enumerate(records):
            e.note("y", rec[step]["y"], rows(want["y"], k))
            e.note("dx", rec[step]["dx"] / WORLD_SIZE, rows(want["dx"], k))
            for n, p in model.named_parameters():
                e.note("params", rec[step]["params"][n], p.detach())
            e.stats("buffers", rec[step]["buffers"], buffers(model))
            e.stats("service", rec[step]["service"], buffers(model))
    return e


# ---- 4. one layer called twice per step -------------------------------------


def run_twice(ctx, seed=46):
    bn = snt.SyncBatchNorm(CHANNELS)
    model = nn.Sequential(bn)
    session = ctx.attach(model, "twice")
    out = []
    for step in range(2):
        x1, r1 = global_batch(seed, 2 * step)
        x2, r2 = global_batch(seed, 2 * step + 1)
        a = rows(x1, ctx.rank).float().requires_grad_(True)
        b = (rows(x2, ctx.rank).float() * 0.5 - 1).requires_grad_(True)
        bn.zero_grad(set_to_none=True)
        y1, y2 = bn(a), bn(b)
        # autograd runs y2's backward (the later round) first
        torch.autograd.backward([y1, y2], [rows(r1, ctx.rank).float(),
                                           rows(r2, ctx.rank).float()])
        out.append({"y1": y1.detach().double(), "y2": y2.detach().double(),
                    "dx1": a.grad.double(), "dx2": b.grad.double(),
                    "grads": grads(bn), "buffers": buffers(model),
                    "service": service_stats(session)})
    return out


def check_twice(records, seed=46):
    reraise(records)
    e = Errors()
    bn = nn.BatchNorm2d(CHANNELS).double()
    for step in range(2):
        x1, r1 = global_batch(seed, 2 * step)
        x2, r2 = global_batch(seed, 2 * step + 1)
        x2 = (x2.float() * 0.5 - 1).double()
        a, b = x1.clone().requires_grad_(True), x2.requires_grad_(True)
        bn.zero_grad(set_to_none=True)
        y1, y2 = bn(a), bn(b)
        torch.autograd.backward([y1, y2], [r1, r2])
        for k, rec in enumerate(records):
            for key, want in (("y1", y1), ("y2", y2), ("dx1", a.grad),
                              ("dx2", b.grad)):
                e.note(key, rec[step][key], rows(want.detach(), k))
        for n, g in grads(bn).items():
            avg = sum(rec[step]["grads"][n] for rec in records) / WORLD_SIZE
            e.note("grad " + n, avg, g / WORLD_SIZE)
        for rec in records:
            e.stats("buffers", rec[step]["buffers"], buffers(bn))
            e.stats("service", rec[step]["service"], buffers(bn))
    return e


# ---- 5. MegEngine freeze, MXNet use_global_stats ----------------------------


def run_frozen(ctx, option, seed=47):
    """MegEngine's test_frozen_bn: SGD with lr 1 on mean(bn(x))."""
    bn = snt.SyncBatchNorm(CHANNELS, momentum=0.9, momentum_mode="megengine",
                           running_mean_initializer=0.5,
                           running_variance_initializer=2.0,
                           **{option: True})
    model = nn.Sequential(bn)
    session = ctx.attach(model, option)
    before = {n: p.detach().clone() for n, p in bn.named_parameters()}
    x, _ = global_batch(seed, 0)
    model.zero_grad(set_to_none=True)
    # The input requires grad, as a layer's output before it would.
    loss = bn(rows(x, ctx.rank).float().requires_grad_(True)).mean()
    loss.backward()
    got = grads(bn)
    with torch.no_grad():
        for p in bn.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-1.0)
    return {"before": before, "grads": got,
            "after": {n: p.detach().clone() for n, p in bn.named_parameters()},
            "loss": float(loss), "buffers": buffers(model),
            "service": service_stats(session)}


def check_frozen(records, option, seed=47):
    reraise(records)
    e = Errors()
    x, _ = global_batch(seed, 0)
    running = [(torch.full((CHANNELS,), 0.5, dtype=torch.float64),
                torch.full((CHANNELS,), 2.0, dtype=torch.float64), 0)]
    for k, rec in enumerate(records):
        e.stats("buffers", rec["buffers"], running)
        e.stats("service", rec["service"], running)
        # Normalized with the running statistics: (x - 0.5) / sqrt(2 + eps).
        want = ((rows(x, k) - 0.5) / (2.0 + 1e-5) ** 0.5).mean()
        e.note("loss", rec["loss"], want)
        for n, p in rec["after"].items():
            if option == "freeze":  # MegEngine: weight and bias unchanged
                e.expect(torch.equal(p, rec["before"][n]),
                         "rank %d: %s changed under SGD" % (k, n))
                e.expect(not rec["grads"][n].any(),
                         "rank %d: %s has a gradient" % (k, n))
    if option == "use_global_stats":
        # MXNet: gamma and beta learn, with torch's eval-mode gradients
        # (the statistics are constants), averaged over ranks as DDP does.
        bn = nn.BatchNorm2d(CHANNELS).double().eval()
        with torch.no_grad():
            bn.running_mean.fill_(0.5)
            bn.running_var.fill_(2.0)
        for k in range(WORLD_SIZE):
            bn.zero_grad(set_to_none=True)
            bn(rows(x, k)).mean().backward()
            for n, g in grads(bn).items():
                e.note("grad " + n, records[k]["grads"][n], g)
                e.note("after " + n, records[k]["after"][n],
                       records[k]["before"][n].double() - g)
    return e


# ---- 6. a global count of one -----------------------------------------------


def run_single_value(ctx):
    """Rank 0 has one row (N=1, C), the others none: one value per channel
    in the global batch."""
    shards = [1, 0, 0, 0]
    out = {}
    for name, kw in (("unbiased", {}),
                     ("untracked", {"track_running_stats": False}),
                     ("biased", {"biased_running_var": True})):
        bn = snt.SyncBatchNorm(CHANNELS, **kw)
        ctx.attach(nn.Sequential(bn), "single-" + name)
        x = rows(torch.arange(CHANNELS, dtype=torch.float32).reshape(1, -1),
                 ctx.rank, shards)
        try:
            y = bn(x)
            out[name] = ("ok", tuple(y.shape))
        except Exception as err:  # compared with torch's below
            out[name] = (type(err).__mro__[0].__name__,
                         isinstance(err, ValueError),
                         isinstance(err, syncnorm.ServiceError), str(err))
    return out


def check_single_value(records):
    reraise(records)
    e = Errors()
    try:
        F.batch_norm(torch.zeros(1, CHANNELS, dtype=torch.float64), None,
                     None, training=True)
        torch_message = None
    except ValueError as err:
        torch_message = str(err)
    e.expect(torch_message is not None, "torch did not refuse it")
    prefix = torch_message.split(",")[0]  # "Expected more ... training"
    for k, rec in enumerate(records):
        for name in ("unbiased", "untracked"):
            got = rec[name]
            e.expect(got[0] != "ok" and got[1] and got[2] and
                     got[3].startswith(prefix),
                     "rank %d, %s: expected a ValueError (and ServiceError) "
                     "starting %r as torch raises, got %s"
                     % (k, name, prefix, got))
        e.expect(rec["biased"][0] == "ok",
                 "rank %d: biased running var (MXNet) refused one value: %s"
                 % (k, rec["biased"]))
    return e


# ---- 7. torch.distributed conventions ---------------------------------------


def run_launch_env(ctx):
    """Before init_process_group: RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID and
    SYNCNORM_ADDRESS (set by the test, as torchrun would)."""
    model = sync_model(48)
    session = snt.attach(model)  # everything from the environment
    x, r = global_batch(48, 0)
    rec = train_step(model, rows(x, ctx.rank), rows(r, ctx.rank))
    rec["who"] = (session.rank, session.world_size, session.job_id,
                  session.client.address)
    return rec


def run_launch_dist(ctx):
    """After init_process_group: torch.distributed's rank and world size
    win over RANK and WORLD_SIZE; explicit arguments win over both."""
    saved = dict(os.environ)
    out = {}
    try:
        os.environ["RANK"] = "99"
        os.environ["WORLD_SIZE"] = "100"
        os.environ["TORCHELASTIC_RUN_ID"] = ctx.run_id + "-launch-dist"
        session = snt.attach(sync_model(49))
        out["dist"] = (session.rank, session.world_size, session.job_id)
        session = snt.attach(sync_model(49), ctx.client,
                             ctx.run_id + "-launch-explicit", ctx.rank,
                             WORLD_SIZE)
        out["explicit"] = (session.rank, session.world_size, session.job_id)
        os.environ["TORCHELASTIC_RUN_ID"] = "none"
        try:
            snt.attach(sync_model(49))
            out["none"] = "accepted"
        except ValueError as err:
            out["none"] = str(err)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return out


def check_launch(records, run_id, address):
    reraise(records)
    e = Errors()
    x, r = global_batch(48, 0)
    want = reference_step(torch_model(48), x, r)
    e.step("env defaults", [rec["env"] for rec in records], want,
           list(range(WORLD_SIZE)))
    for k, rec in enumerate(records):
        e.expect(rec["env"]["who"] == (k, WORLD_SIZE, run_id + "-launch",
                                       address),
                 "rank %d attached as %s" % (k, rec["env"]["who"]))
        d = rec["dist"]
        e.expect(d["dist"] == (k, WORLD_SIZE, run_id + "-launch-dist"),
                 "rank %d with torch.distributed: %s" % (k, d["dist"]))
        e.expect(d["explicit"] == (k, WORLD_SIZE, run_id + "-launch-explicit"),
                 "rank %d with arguments: %s" % (k, d["explicit"]))
        e.expect("--rdzv_id" in d["none"],
                 "rank %d: TORCHELASTIC_RUN_ID=none: %s" % (k, d["none"]))
    return e
