"""The model, the batches and the float64 references of precise_bn_test,
shared by the test and its workers (precise_bn_worker.py)."""

import torch
import torch.nn.functional as F
from torch import nn

WORLD_SIZE = 4
# Each rank's batches for precise BN: uneven numbers of uneven sizes.
BATCH_SIZES = {0: [5, 3, 4], 1: [6, 2], 2: [3, 5, 4, 2], 3: [7]}
# The process groups of the "groups" scenario: not consecutive blocks.
GROUPS = [[0, 2], [1, 3]]
TRAIN_STEPS = 3
TRAIN_ROWS = 4
# The rank that SIGKILLs itself at the second layer of the "kill" scenario.
KILL_RANK = 1
# The BN layers in the order their forwards run; Net registers them (and
# attach numbers them) in another order: bn_c, bn_a, bn_b, bn_d.
FORWARD_ORDER = ["bn_a", "bn_b", "bn_c", "bn_d"]
SCENARIOS = {
    # name: (one_pass, groups, round timeout of the job in ms)
    "exact": (False, None, 20000),
    "one_pass": (True, None, 20000),
    "groups": (False, GROUPS, 20000),
    "kill": (False, None, 2000),
}


class Net(nn.Module):
    """Three conv-BN-ReLU layers and a BN1d head, with weights from a
    fixed seed (the same on every rank and in the reference)."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(7)
            self.bn_c = nn.BatchNorm2d(6)
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
            self.bn_a = nn.BatchNorm2d(4)
            self.conv2 = nn.Conv2d(4, 5, 3, padding=1)
            self.bn_b = nn.BatchNorm2d(5)
            self.conv3 = nn.Conv2d(5, 6, 1)
            self.fc = nn.Linear(6, 4)
            self.bn_d = nn.BatchNorm1d(4)
            for name in FORWARD_ORDER:
                bn = getattr(self, name)
                nn.init.uniform_(bn.weight, 0.5, 1.5)
                nn.init.uniform_(bn.bias, -0.5, 0.5)

    def forward(self, x):
        x = F.relu(self.bn_a(self.conv1(x)))
        x = F.relu(self.bn_b(self.conv2(x)))
        x = F.relu(self.bn_c(self.conv3(x)))
        return self.bn_d(self.fc(x.mean(dim=(2, 3))))


def _data(seed, rows):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 3, 5, 5, generator=g) * 1.5 + 0.7


def batches(scenario, rank):
    """The rank's batches for precise BN (float32)."""
    base = 1000 * (1 + list(SCENARIOS).index(scenario)) + 100 * rank
    return [_data(base + k, n) for k, n in enumerate(BATCH_SIZES[rank])]


def train_batch(rank, step):
    """The rank's training batch at `step`: other data than its precise-BN
    batches, so the running statistics start away from the truth."""
    return _data(50000 + 100 * rank + step, TRAIN_ROWS) * 0.5 - 0.3


def reference(state, xs, one_pass):
    """{layer name: (population count, mean, unbiased var)} in float64 of
    a plain torch model with the weights of `state` over the batches `xs`
    (every batch of every rank of a group).

    Default: layer by layer in forward order, an eval forward of every
    sample with the layers before it set to their reference statistics.
    one_pass: one forward per batch with every layer normalizing with its
    batch's statistics (torch's training mode), inputs pooled."""
    model = Net().double()
    model.load_state_dict({k: v.double() if v.is_floating_point() else v
                           for k, v in state.items()})
    inputs = {name: [] for name in FORWARD_ORDER}
    hooks = [getattr(model, name).register_forward_pre_hook(
        lambda m, a, name=name: inputs[name].append(a[0]))
        for name in FORWARD_ORDER]
    out = {}
    with torch.no_grad():
        if one_pass:
            model.train()
            for x in xs:
                model(x.double())
        else:
            model.eval()
            for name in FORWARD_ORDER:
                for k in inputs:
                    inputs[k].clear()
                model(torch.cat(xs).double())
                out[name] = _population(inputs[name])
                bn = getattr(model, name)
                bn.running_mean.copy_(out[name][1])
                bn.running_var.copy_(out[name][2])
    for h in hooks:
        h.remove()
    if one_pass:
        out = {name: _population(inputs[name]) for name in FORWARD_ORDER}
    return out


def _population(tensors):
    """(count, mean, unbiased var) per channel of (N, C, ...) tensors."""
    x = torch.cat([t.movedim(1, -1).reshape(-1, t.shape[1])
                   for t in tensors])
    return x.shape[0], x.mean(0), x.var(0, unbiased=True)
