"""The torch comparison cases: models, data, a syncnorm worker's run and the
torch reference on the concatenated batch.

A case is a dict (see CASES). Its global batch of each step is generated
from the case's seed, so the workers and the reference see the same values;
worker r takes rows [offset_r, offset_r + shards[r]).

BN cases run a model of two BN layers joined by a quadratic:
y = bn2(h + h^2 / 4) with h = bn1(x [, z]), loss = sum(y * R) (half types
run one layer). ResNet cases run a small ResNet through
convert_sync_batchnorm. Weights are not stepped, so the state that carries
over steps is the running statistics.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import syncnorm.torch as snt

DTYPES = {"float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
SPATIAL = {2: (), 3: (5,), 4: (3, 4), 5: (2, 3, 2)}


def _case(name, **kw):
    case = dict(name=name, dim=4, channels=3, shards=[5, 3, 4], steps=3,
                momentum=0.1, momentum_mode=None, layout="contiguous",
                fuse_relu=False, residual=False, freeze=False,
                use_global_stats=False, affine=True, center=True, scale=True,
                track=True, biased=False, dtype="float32", eps=1e-5, seed=1,
                model="bn", layers=2)
    case.update(kw)
    return case


CASES = [
    _case("torch_momentum_4d", seed=11),
    _case("torch_momentum_2d_many_steps", dim=2, channels=5, steps=6,
          shards=[7, 2, 4], seed=12),
    _case("torch_momentum_zero_3d", dim=3, momentum=0.0, seed=13),
    _case("megengine_decay_3d", dim=3, momentum=0.9,
          momentum_mode="megengine", seed=14),
    _case("mxnet_decay_biased_var_2d", dim=2, momentum=0.9,
          momentum_mode="mxnet", biased=True, seed=15),
    _case("cumulative_5d", dim=5, momentum=None, seed=16),
    _case("apex_channel_last_4d_relu_z", layout="channel_last",
          fuse_relu=True, residual=True, seed=17),
    _case("apex_channel_last_3d", dim=3, layout="channel_last", seed=18),
    _case("apex_channel_last_5d", dim=5, layout="channel_last", seed=19),
    _case("torch_channels_last_memory_4d", layout="memory_channels_last",
          seed=20),
    _case("torch_channels_last_memory_5d", dim=5,
          layout="memory_channels_last", fuse_relu=True, seed=21),
    _case("megengine_freeze_4d", freeze=True, momentum=0.9,
          momentum_mode="megengine", seed=22),
    _case("mxnet_use_global_stats_3d", dim=3, use_global_stats=True,
          seed=23),
    _case("empty_shard_4d", shards=[6, 0, 4], seed=24),
    _case("empty_shard_first_2d", dim=2, shards=[0, 5, 4], seed=25),
    _case("no_affine_3d", dim=3, affine=False, seed=26),
    _case("mxnet_center_only_4d", scale=False, seed=27),
    _case("mxnet_scale_only_2d", dim=2, center=False, seed=28),
    _case("no_running_stats_4d", track=False, seed=29),
    # Half input through one layer, so that no torch op in half precision
    # sits between the layers: the errors are syncnorm's (output rounding).
    _case("float16_4d", dtype="float16", layers=1, seed=30),
    _case("bfloat16_3d", dim=3, dtype="bfloat16", layers=1, seed=31),
    _case("float16_channel_last_relu_z", dtype="float16", layers=1,
          layout="channel_last", fuse_relu=True, residual=True, seed=32),
    _case("resnet_convert", model="resnet", channels=3, shards=[4, 3, 5],
          steps=2, seed=33),
]
BY_NAME = {c["name"]: c for c in CASES}


def tolerance(case):
    return {"float32": 1e-5, "float16": 5e-3, "bfloat16": 3e-2}[case["dtype"]]


def offsets(case):
    out, start = [], 0
    for n in case["shards"]:
        out.append(start)
        start += n
    return out


# ---- data ---------------------------------------------------------------


def _global_shape(case, n):
    return (n, case["channels"]) + SPATIAL[case["dim"]]


def step_data(case, step):
    """(x, R, z) of the global batch in float64, x and z already rounded to
    the case's dtype; z is None unless the case has a residual."""
    g = torch.Generator().manual_seed(case["seed"] * 1000 + step)
    shape = _global_shape(case, sum(case["shards"]))
    if case["model"] == "resnet":
        shape = (sum(case["shards"]), 3, 8, 8)
    dtype = DTYPES[case["dtype"]]
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 3)
    x = x.to(dtype).double()
    if case["model"] == "resnet":
        r = torch.randn((shape[0], 10), generator=g, dtype=torch.float64)
    else:
        r = torch.randn(shape, generator=g, dtype=torch.float64)
    r = r.to(dtype).double()
    z = None
    if case["residual"]:
        z = torch.randn(shape, generator=g, dtype=torch.float64).to(
            dtype).double()
    return x, r, z


def eval_data(case):
    x, _, _ = step_data(case, 999)
    return x


def initial_values(case):
    """gamma, beta, running mean, running var of each of the two layers."""
    g = torch.Generator().manual_seed(case["seed"])
    c = case["channels"]
    out = []
    for _ in range(2):
        out.append((torch.rand(c, generator=g) + 0.5,
                    torch.randn(c, generator=g) * 0.5,
                    torch.randn(c, generator=g) * 0.3,
                    torch.rand(c, generator=g) + 0.5))
    return out


def to_layout(case, t):
    """A global (N, C, ...) tensor as the syncnorm side feeds it."""
    if t is None:
        return None
    if case["layout"] == "channel_last" and t.dim() > 2:
        return t.movedim(1, -1).contiguous()
    if case["layout"] == "memory_channels_last" and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if case["layout"] == "memory_channels_last" and t.dim() == 5:
        return t.contiguous(memory_format=torch.channels_last_3d)
    return t


def from_layout(case, t):
    if case["layout"] == "channel_last" and t.dim() > 2:
        return t.movedim(-1, 1)
    return t


# ---- models -------------------------------------------------------------


class TwoBN(nn.Module):
    """bn2(h + h^2 / 4) with h = bn1(x [, z]); h without bn2."""

    def __init__(self, bn1, bn2=None, fuse_relu_ref=False):
        super().__init__()
        self.bn1 = bn1
        self.bn2 = bn2
        self.fuse_relu_ref = fuse_relu_ref

    def forward(self, x, z=None):
        if self.fuse_relu_ref:  # the torch reference of apex's fused form
            h = self.bn1(x)
            h = F.relu(h + z if z is not None else h)
        elif z is not None:
            h = self.bn1(x, z)
        else:
            h = self.bn1(x)
        if self.bn2 is None:
            return h
        return self.bn2(h + 0.25 * h * h)


def sync_model(case):
    """The syncnorm model of a BN case, in the case's dtype."""
    layers = []
    for i, (gamma, beta, mean, var) in enumerate(initial_values(case)):
        layers.append(snt.SyncBatchNorm(
            case["channels"], eps=case["eps"], momentum=case["momentum"],
            affine=case["affine"], track_running_stats=case["track"],
            channel_last=case["layout"] == "channel_last",
            fuse_relu=case["fuse_relu"] and i == 0,
            momentum_mode=case["momentum_mode"], freeze=case["freeze"],
            center=case["center"], scale=case["scale"],
            use_global_stats=case["use_global_stats"],
            gamma_initializer=gamma, beta_initializer=beta,
            running_mean_initializer=mean,
            running_variance_initializer=var,
            biased_running_var=case["biased"]))
    return TwoBN(*layers[:case["layers"]])


def _torch_momentum(case):
    m, mode = case["momentum"], case["momentum_mode"]
    if m is None:
        return None
    if mode in ("megengine", "mxnet", "decay"):
        return 1.0 - m
    return m


def reference_model(case):
    """The torch model of a BN case in float64 (BatchNorm1d/2d/3d)."""
    cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d,
           5: nn.BatchNorm3d}[case["dim"]]
    layers = []
    for gamma, beta, mean, var in initial_values(case):
        bn = cls(case["channels"], eps=case["eps"],
                 momentum=_torch_momentum(case), affine=case["affine"],
                 track_running_stats=case["track"]).double()
        with torch.no_grad():
            if case["affine"]:
                bn.weight.copy_(gamma if case["scale"] else torch.ones_like(
                    gamma))
                bn.bias.copy_(beta if case["center"] else torch.zeros_like(
                    beta))
                bn.weight.requires_grad_(case["scale"])
                bn.bias.requires_grad_(case["center"])
            if case["track"]:
                bn.running_mean.copy_(mean)
                bn.running_var.copy_(var)
        layers.append(bn)
    return TwoBN(*layers[:case["layers"]], fuse_relu_ref=case["fuse_relu"])


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride,
                                                bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNetish(nn.Module):
    """stem conv-bn-relu, two basic blocks (the second downsamples), pool,
    linear, BatchNorm1d: 7 BN layers."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(8), nn.ReLU())
        self.block1 = Block(8, 8, 1)
        self.block2 = Block(8, 16, 2)
        self.fc = nn.Linear(16, 10)
        self.head_bn = nn.BatchNorm1d(10)

    def forward(self, x):
        x = self.block2(self.block1(self.stem(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.head_bn(self.fc(x))


def resnet(case):
    torch.manual_seed(case["seed"])
    model = ResNetish()
    # Non-trivial affine parameters and running statistics.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.3)
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model


# ---- runs ---------------------------------------------------------------


def _bn_modules(model):
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _grads(model):
    return {n: (p.grad.detach().double().clone() if p.grad is not None
                else torch.zeros_like(p, dtype=torch.float64))
            for n, p in model.named_parameters() if p.requires_grad}


def _running(model):
    out = []
    for bn in _bn_modules(model):
        if bn.track_running_stats:
            out.append((bn.running_mean.double().clone(),
                        bn.running_var.double().clone(),
                        int(bn.num_batches_tracked)))
    return out


def worker_run(case, rank, world_size, client, job_id):
    """One rank's run of a case through syncnorm; returns its records."""
    dtype = DTYPES[case["dtype"]]
    if case["model"] == "resnet":
        model = snt.convert_sync_batchnorm(resnet(case))
        converted = sum(isinstance(m, snt.SyncBatchNorm)
                        for m in model.modules())
        assert converted == 7, converted
    else:
        # Parameters and buffers stay float32 for half input (as apex and
        # AMP keep BN); the output has the input's dtype.
        model = sync_model(case)
    model.train()
    session = snt.attach(model, client, job_id, rank, world_size,
                         round_timeout_ms=20000)
    lo = offsets(case)[rank]
    hi = lo + case["shards"][rank]
    steps = []
    for step in range(case["steps"]):
        x, r, z = step_data(case, step)
        x = to_layout(case, x[lo:hi].to(dtype)).requires_grad_(True)
        r = to_layout(case, r[lo:hi].to(dtype))
        z = None if z is None else to_layout(
            case, z[lo:hi].to(dtype)).requires_grad_(True)
        model.zero_grad(set_to_none=True)
        y = model(x, z) if z is not None else model(x)
        (y * r).sum().backward()
        steps.append({
            "y": from_layout(case, y.detach()).double(),
            "dx": from_layout(case, x.grad).double(),
            "dz": None if z is None else from_layout(case, z.grad).double(),
            "grads": _grads(model)})
    model.eval()
    with torch.no_grad():
        y_eval = from_layout(case, model(to_layout(
            case, eval_data(case).to(dtype)))).double()
    stats = client.get_running_stats(job_id, group=session.group_index)
    server = [(torch.tensor(l["running_mean"], dtype=torch.float64),
               torch.tensor(l["running_var"], dtype=torch.float64),
               l["num_batches_tracked"]) for l in stats["layers"]
              if session.layers[l["layer"]].track_running_stats]
    return {"steps": steps, "running": _running(model), "server": server,
            "eval": y_eval, "sync_seconds": session.sync_seconds,
            "state_keys": sorted(model.state_dict().keys())}


def _biased_hook(records):
    def hook(module, inputs):
        x = inputs[0].detach()
        dims = [d for d in range(x.dim()) if d != 1]
        records.append((x.mean(dims), x.var(dims, unbiased=False)))
    return hook


def reference_run(case):
    """The torch run of a case on the concatenated batch, in float64."""
    if case["model"] == "resnet":
        model = resnet(case).double()
    else:
        model = reference_model(case)
    model.train()
    frozen = case["freeze"] or case["use_global_stats"]
    if frozen:
        for bn in _bn_modules(model):
            bn.eval()
    manual = None
    if case["biased"]:  # torch has no biased running var: apply it here
        manual = [[] for _ in _bn_modules(model)]
        for bn, rec in zip(_bn_modules(model), manual):
            bn.register_forward_pre_hook(_biased_hook(rec))
        initial = _running(model)
    steps = []
    for step in range(case["steps"]):
        x, r, z = step_data(case, step)
        x.requires_grad_(True)
        if z is not None:
            z.requires_grad_(True)
        model.zero_grad(set_to_none=True)
        y = model(x, z) if z is not None else model(x)
        (y * r).sum().backward()
        grads = _grads(model)
        if case["freeze"]:  # MegEngine: gamma and beta are frozen too
            grads = {n: torch.zeros_like(g) for n, g in grads.items()}
        steps.append({"y": y.detach(), "dx": x.grad,
                      "dz": None if z is None else z.grad,
                      "grads": grads})
    running = _running(model)
    if manual is not None:
        m = case["momentum"]
        running = []
        for (mean, var, _), rec in zip(initial, manual):
            for bm, bv in rec:
                mean = m * mean + (1 - m) * bm
                var = m * var + (1 - m) * bv
            running.append((mean, var, len(rec)))
        with torch.no_grad():
            for bn, (mean, var, n) in zip(_bn_modules(model), running):
                bn.running_mean.copy_(mean)
                bn.running_var.copy_(var)
    model.eval()
    with torch.no_grad():
        y_eval = model(eval_data(case))
    return {"steps": steps, "running": running, "eval": y_eval}
