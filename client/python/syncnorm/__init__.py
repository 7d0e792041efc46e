"""syncnorm: synchronized batch normalization as a service.

``syncnorm.Client`` talks to the aggregator (jobs, running statistics,
checkpoints); ``syncnorm.torch`` has the drop-in ``SyncBatchNorm`` module,
``convert_sync_batchnorm`` and ``attach``. The extension ``_syncnorm`` holds
the C++ client and kernels; it does not link libtorch. The installed
package also holds the aggregator and syncnormctl (``syncnorm.aggregator``,
``syncnorm.ctl``). ``__version__`` is the project's version (its VERSION
file), the one the aggregator and syncnormctl report.
"""


def _load_extension():
    try:
        from . import _syncnorm
    except ImportError as e:
        if "shared object" not in str(e):
            raise
        try:
            from importlib import metadata
            packages = metadata.metadata("syncnorm").get_all(
                "Requires-External") or []
        except Exception:  # not installed from a wheel: no metadata
            packages = []
        hint = ("apt-get install " + " ".join(p for p in packages
                                              if " " not in p)
                if packages
                else "see docs/python.md, \"Installing the package\"")
        raise ImportError(
            "syncnorm's extension links Debian 12's shared libraries and "
            "one is missing (%s); install the packages it needs: %s" %
            (e, hint)) from e
    return _syncnorm


__version__ = _load_extension().__version__

from ._client import (Client, ServiceError, SingleValuePerChannelError,  # noqa: E402
                      MOMENTUM_MODES, group_of, layer_spec, member_since,
                      momentum_mode_code)

__all__ = ["Client", "ServiceError", "SingleValuePerChannelError",
           "MOMENTUM_MODES", "group_of", "layer_spec", "member_since",
           "momentum_mode_code",
           "__version__"]
