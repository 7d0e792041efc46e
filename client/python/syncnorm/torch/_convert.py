"""convert_sync_batchnorm."""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ._batch_norm import SyncBatchNorm


def convert_sync_batchnorm(module, process_group=None, **kwargs):
    """Replaces every torch BatchNorm1d/2d/3d and torch.nn.SyncBatchNorm in
    `module` (or `module` itself) by a syncnorm SyncBatchNorm with the same
    num_features, eps, momentum, affine and track_running_stats, the same
    Parameter and buffer objects, and the same training flag. kwargs go to
    SyncBatchNorm (channel_last, fuse_relu, momentum_mode, ...). Returns the
    converted module (the same object unless `module` is a BN itself)."""
    output = module
    if isinstance(module, _BatchNorm) and not isinstance(module,
                                                         SyncBatchNorm):
        output = SyncBatchNorm(module.num_features, module.eps,
                               module.momentum, module.affine,
                               module.track_running_stats, process_group,
                               **kwargs)
        if module.affine:
            with torch.no_grad():
                output.weight = module.weight
                output.bias = module.bias
        output.running_mean = module.running_mean
        output.running_var = module.running_var
        output.num_batches_tracked = module.num_batches_tracked
        output.training = module.training
        if hasattr(module, "qconfig"):
            output.qconfig = module.qconfig
    for name, child in module.named_children():
        output.add_module(name, convert_sync_batchnorm(child, process_group,
                                                       **kwargs))
    return output


SyncBatchNorm.convert_sync_batchnorm = staticmethod(convert_sync_batchnorm)
