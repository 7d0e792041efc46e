"""syncnorm: synchronized batch normalization as a service.

``syncnorm.Client`` talks to the aggregator (jobs, running statistics,
checkpoints); ``syncnorm.torch`` has the drop-in ``SyncBatchNorm`` module,
``convert_sync_batchnorm`` and ``attach``. The extension ``_syncnorm`` holds
the C++ client and kernels; it does not link libtorch.
"""

from ._client import (Client, ServiceError, SingleValuePerChannelError,
                      MOMENTUM_MODES, group_of, layer_spec,
                      momentum_mode_code)

__all__ = ["Client", "ServiceError", "SingleValuePerChannelError",
           "MOMENTUM_MODES", "group_of", "layer_spec", "momentum_mode_code"]
