"""The autograd Function of SyncBatchNorm's training forward: kernels and
rounds."""

import torch

from .. import _syncnorm
from ._tensors import desc, host_f32, like, on_device


class SyncBatchNormFunction(torch.autograd.Function):
    """Forward: local moments -> sync -> normalize. Backward: local sums ->
    sync -> grad_input; grad_weight and grad_bias stay local, as in
    torch.nn.SyncBatchNorm (the trainer averages gradients). The backward
    runs outside autograd: it has no derivative of its own (see
    _refuse_double_backward)."""

    @staticmethod
    def forward(ctx, x, weight, bias, z, bn):
        with on_device(x):
            return SyncBatchNormFunction._forward(ctx, x, weight, bias, z, bn)

    @staticmethod
    def backward(ctx, dy):
        _refuse_double_backward(ctx.bn)
        _refuse_second_backward(ctx)
        with on_device(dy):
            grads = SyncBatchNormFunction._backward(ctx, dy)
        ctx.synced_backwards += 1
        return grads

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
        ctx.synced_backwards = 0
        ctx.state = (step, count, mean, invstd, z is not None)
        ctx.save_for_backward(x, y if bn.fuse_relu else None, weight)
        return y

    @staticmethod
    def _backward(ctx, dy):
        x, y, weight = ctx.saved_tensors
        bn = ctx.bn
        step, count, mean, invstd, had_z = ctx.state
        pool, stream = bn._exec(x)
        cl = bn.channel_last
        dy = like(dy, x)
        xd, dyd, yd = desc(x), desc(dy), desc(y)
        sum_dy, sum_dy_xmu, gw, gb = _syncnorm.backward_reduce(
            dyd, xd, yd, mean, invstd, cl, pool, stream)
        sum_dy, sum_dy_xmu = bn._sync_backward(step, sum_dy, sum_dy_xmu)
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


def _layer_name(bn):
    session = bn._sn_session
    name = session.names[bn._sn_layer] if session is not None else ""
    return " '%s'" % name if name else ""


def _refuse_second_backward(ctx):
    """Raises before the round when this forward's backward round has run:
    the service keys a backward round by the forward's step alone, so a
    second one (retain_graph=True) would collide with the first. A
    backward whose round failed may be run again (a retry)."""
    if ctx.synced_backwards == 0:
        return
    raise RuntimeError(
        "syncnorm's SyncBatchNorm%s ran a second backward through one "
        "training forward (step %d, retain_graph=True): the service syncs "
        "one backward round per forward step, and the second is not "
        "supported yet (torch.nn.SyncBatchNorm all-reduces per backward). "
        "Sum the losses into one backward, or run the forward again for "
        "each backward" % (_layer_name(ctx.bn), ctx.state[0]))


def _refuse_double_backward(bn):
    """Raises before the round when the backward would have to be
    differentiated: autograd runs a backward with grad mode on exactly when
    it was asked to create_graph=True, and this backward's kernels and
    round are outside autograd, so a derivative through it would be
    silently wrong (torch.nn.SyncBatchNorm raises too)."""
    if not torch.is_grad_enabled():
        return
    raise RuntimeError(
        "syncnorm's SyncBatchNorm%s has no double backward: its training "
        "backward ran with create_graph=True (torch.autograd.grad(..., "
        "create_graph=True) or backward(create_graph=True), as a gradient "
        "penalty does), and its derivative is not implemented (torch."
        "nn.SyncBatchNorm: \"derivative for batch_norm_backward_elemt is not "
        "implemented\"). Layers that normalize with the running statistics "
        "(eval, freeze, use_global_stats) run torch's batch_norm and have one"
        % _layer_name(bn))
