"""The autograd Functions of SyncBatchNorm's training forward: kernels and
rounds, and a backward that is itself differentiable."""

import torch

from .. import _syncnorm
from ._tensors import desc, host_f32, like, on_device


class SyncBatchNormFunction(torch.autograd.Function):
    """Forward: local moments -> sync -> normalize. Backward: local sums ->
    sync -> grad_input; grad_weight and grad_bias stay local, as in
    torch.nn.SyncBatchNorm (the trainer averages gradients). Every backward
    through one forward is its own round, as torch's all-reduce per
    backward (retain_graph=True: PCGrad, GradNorm, GAN loops).

    A backward run with create_graph=True (a gradient penalty) is built of
    torch ops over two differentiable syncs, _GroupMoments and _GroupSum
    (see _differentiable_backward), so that its derivative, of any order,
    is exact across ranks; the plain backward runs the fused kernels."""

    @staticmethod
    def forward(ctx, x, weight, bias, z, bn):
        with on_device(x):
            return SyncBatchNormFunction._forward(ctx, x, weight, bias, z, bn)

    @staticmethod
    def backward(ctx, dy):
        with on_device(dy):
            # Grad mode is on in a backward exactly when it was asked to
            # create_graph=True.
            if torch.is_grad_enabled():
                return _differentiable_backward(ctx, dy)
            return SyncBatchNormFunction._backward(ctx, dy)

    @staticmethod
    def _forward(ctx, x, weight, bias, z, bn):
        pool, stream = bn._exec(x)
        cl = bn.channel_last
        xd = desc(x)
        count, mean, m2 = _syncnorm.local_moments(xd, cl, pool, stream)
        step, count, mean, var = bn._sync_forward(count, mean, m2, x.shape)
        invstd = _syncnorm.inv_std(var, bn.eps)
        y = torch.empty_like(x)
        _syncnorm.forward(xd, desc(y), desc(z), host_f32(weight),
                          host_f32(bias), mean, invstd, bn.fuse_relu, cl,
                          pool, stream)
        ctx.bn = bn
        ctx.rounds = _BackwardRounds(bn, step)
        ctx.state = (step, count, mean, var, invstd, z is not None)
        ctx.save_for_backward(x, y if bn.fuse_relu else None, weight)
        return y

    @staticmethod
    def _backward(ctx, dy):
        x, y, weight = ctx.saved_tensors
        bn = ctx.bn
        _, count, mean, _, invstd, had_z = ctx.state
        pool, stream = bn._exec(x)
        cl = bn.channel_last
        dy = like(dy, x)
        xd, dyd, yd = desc(x), desc(dy), desc(y)
        sum_dy, sum_dy_xmu, gw, gb = _syncnorm.backward_reduce(
            dyd, xd, yd, mean, invstd, cl, pool, stream)
        sum_dy, sum_dy_xmu = ctx.rounds.sum(sum_dy, sum_dy_xmu)
        # Global count 0: every batch was empty, nothing to scale.
        n = float(count) if count > 0 else 1.0
        mean_dy, mean_dy_xmu = sum_dy / n, sum_dy_xmu / n
        grad_input = torch.empty_like(x)
        grad_z = torch.empty_like(x) if had_z else None
        _syncnorm.backward_elementwise(
            dyd, xd, yd, mean, invstd, host_f32(weight), mean_dy,
            mean_dy_xmu, desc(grad_input), desc(grad_z), cl, pool, stream)
        grad_weight = grad_bias = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = torch.from_numpy(gw).to(weight.dtype).to(
                weight.device)
        if ctx.needs_input_grad[2]:
            grad_bias = torch.from_numpy(gb).to(
                bn.bias.dtype).to(bn.bias.device)
        return grad_input, grad_weight, grad_bias, grad_z, None


class _BackwardRounds:
    """The backward rounds through one training forward of a layer: each
    takes the next backward index of the forward's step, in the order
    autograd runs them (the same on every rank, whose graphs are the
    same), and one whose round failed runs again under its index (a
    retry)."""

    def __init__(self, bn, step):
        self.bn = bn
        self.step = step
        self.next = 0

    def sum(self, a, b):
        """The group's sums of two per-channel float64 arrays."""
        got = self.bn._sync_backward(self.step, self.next, a, b)
        self.next += 1
        return got


class _GroupSum(torch.autograd.Function):
    """The sums over the group's ranks of two per-channel float64 vectors,
    through a backward round. Linear and the same on every rank, so its
    derivative is the group's sum of the upstream gradients: another
    round."""

    @staticmethod
    def forward(ctx, a, b, rounds):
        ctx.rounds = rounds
        sa, sb = rounds.sum(a.detach().cpu().numpy(), b.detach().cpu().numpy())
        return (torch.from_numpy(sa).to(a.device),
                torch.from_numpy(sb).to(b.device))

    @staticmethod
    def backward(ctx, ga, gb):
        sa, sb = _GroupSum.apply(ga, gb, ctx.rounds)
        return sa, sb, None


class _GroupMoments(torch.autograd.Function):
    """The group's mean and biased variance as functions of this rank's x
    (float64): the forward's round gave their values, passed in; their
    derivative is that of the merge of every rank's batch, for x_i of any
    rank: d mean / d x_i = 1 / N, d var / d x_i = 2 (x_i - mean) / N. So the
    backward sums the upstream gradients over the group (a round) and
    scales; it is made of differentiable ops, for derivatives of any
    order."""

    @staticmethod
    def forward(ctx, x, mean, var, n, cdim, rounds):
        mean, var = mean.clone(), var.clone()
        ctx.n, ctx.cdim, ctx.rounds = n, cdim, rounds
        ctx.save_for_backward(x, mean)
        return mean, var

    @staticmethod
    def backward(ctx, g_mean, g_var):
        x, mean = ctx.saved_tensors
        g_mean, g_var = _GroupSum.apply(g_mean, g_var, ctx.rounds)
        shape = _channel_shape(x, ctx.cdim)
        grad_x = (g_mean.view(shape) + 2.0 * g_var.view(shape) *
                  (x - mean.view(shape))) / ctx.n
        return grad_x, None, None, None, None, None


def _channel_shape(x, cdim):
    """The shape that broadcasts a per-channel vector over x."""
    shape = [1] * x.dim()
    shape[cdim] = -1
    return shape


def _differentiable_backward(ctx, dy):
    """SyncBatchNormFunction's backward as differentiable torch ops in
    float64: torch's batch-norm backward with the global mean and variance
    as functions of x (_GroupMoments) and the global sums of dy and
    dy * x_hat through _GroupSum. Differentiating it again (the gradient
    penalty's backward) runs the rounds of their derivatives: exact on
    the concatenated batch of every rank, where torch.nn.SyncBatchNorm
    raises."""
    x, y, weight = ctx.saved_tensors
    bn = ctx.bn
    _, count, mean, var, _, had_z = ctx.state
    cdim = x.dim() - 1 if bn.channel_last and x.dim() > 2 else 1
    dims = [d for d in range(x.dim()) if d != cdim]
    shape = _channel_shape(x, cdim)
    # Global count 0: every batch was empty, nothing to scale.
    n = float(count) if count > 0 else 1.0
    x64 = x.double()
    g_mean, g_var = _GroupMoments.apply(
        x64, torch.as_tensor(mean, dtype=torch.float64, device=x.device),
        torch.as_tensor(var, dtype=torch.float64, device=x.device), n, cdim,
        ctx.rounds)
    invstd = torch.rsqrt(g_var + bn.eps)
    x_hat = (x64 - g_mean.view(shape)) * invstd.view(shape)
    dy64 = dy.double()
    if bn.fuse_relu:
        dy64 = dy64 * (y > 0)
    local_dy = dy64.sum(dims)
    local_dy_xhat = (dy64 * x_hat).sum(dims)
    sum_dy, sum_dy_xhat = _GroupSum.apply(local_dy, local_dy_xhat, ctx.rounds)
    scale = invstd if weight is None else weight.double() * invstd
    grad_input = scale.view(shape) * (
        dy64 - (sum_dy / n).view(shape) - x_hat * (sum_dy_xhat / n).view(shape))
    grad_weight = grad_bias = None
    if weight is not None and ctx.needs_input_grad[1]:
        grad_weight = local_dy_xhat.to(weight.dtype)
    if ctx.needs_input_grad[2]:
        grad_bias = local_dy.to(bn.bias.dtype)
    grad_z = dy64.to(x.dtype) if had_z else None
    return grad_input.to(x.dtype), grad_weight, grad_bias, grad_z, None
