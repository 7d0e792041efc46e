"""The data and model of autograd_test, shared by its workers and its
float64 torch reference: a Conv2d-BatchNorm2d-Tanh model, a global batch
split unevenly over W = 3 ranks, and upstream gradients."""

import torch
import torch.nn as nn

WORLD_SIZE = 3
SHARDS = (3, 2, 4)
CHANNELS = 4
# Upstream gradients of the backwards through one forward.
SEEDS = (1, 2, 3)
# What is differentiated twice: the gradient penalty alone, and WGAN-GP's
# loss plus ten times it.
PENALTY_MODES = ("penalty", "gp")


def penalty_loss(mode, loss, g):
    """The loss of a double backward from `loss` and its gradient `g`
    w.r.t. the input (create_graph=True)."""
    penalty = g.pow(2).sum()
    return penalty if mode == "penalty" else loss + 10.0 * penalty


def model():
    """The model with fixed random parameters (and BN's weight and bias
    away from 1 and 0)."""
    torch.manual_seed(33)
    m = nn.Sequential(nn.Conv2d(2, CHANNELS, 3, padding=1),
                      nn.BatchNorm2d(CHANNELS), nn.Tanh())
    with torch.no_grad():
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-0.5, 0.5)
    return m


def batch():
    g = torch.Generator().manual_seed(7)
    return torch.randn(sum(SHARDS), 2, 5, 5, generator=g) * 2 + 0.5


def upstream(seed):
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randn(sum(SHARDS), CHANNELS, 5, 5, generator=g)


def shard(t, rank):
    lo = sum(SHARDS[:rank])
    return t[lo:lo + SHARDS[rank]].clone()


def grads(m):
    """Parameter gradients by name (None for none)."""
    return {n: None if p.grad is None else p.grad.clone()
            for n, p in m.named_parameters()}


def apex_inputs():
    """apex's layout: (N, H, W, C) input (channel_last) and a residual z
    of the same shape, the global batch."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(sum(SHARDS), 3, 3, CHANNELS, generator=g) * 1.5 - 0.25
    z = torch.randn(sum(SHARDS), 3, 3, CHANNELS, generator=g) * 0.5
    return x, z


def apex_affine():
    """The apex layer's weight and bias."""
    g = torch.Generator().manual_seed(12)
    return (torch.rand(CHANNELS, generator=g) + 0.5,
            torch.rand(CHANNELS, generator=g) - 0.5)


def apex_upstream():
    g = torch.Generator().manual_seed(13)
    return torch.randn(sum(SHARDS), 3, 3, CHANNELS, generator=g)
