"""PyTorch integration: a drop-in SyncBatchNorm whose statistics come from
the syncnorm aggregator.

    model = syncnorm.torch.convert_sync_batchnorm(model)       # or build with
    session = syncnorm.torch.attach(model, "host:50051",        # SyncBatchNorm
                                    job_id="run7", rank=rank, world_size=W)
    ...train as usual (loss.backward() syncs the backward sums)...

How layers, jobs and ranks map:

* ``attach`` numbers the model's SyncBatchNorm modules in ``model.modules()``
  order (layer 0, 1, ...), names them by their qualified module name, and
  creates the job with one LayerSpec per layer. Every rank calls it with the
  same model, so every rank sends the same spec (CreateJob is idempotent).
* ``rank`` / ``world_size`` are the job's contributors: one per process
  (one GPU or CPU worker each). ``process_group`` of the layers (or
  ``group_size`` of attach) splits them into groups of consecutive ranks,
  each with its own statistics (like apex's group_size).
* Each training forward of a layer is one round with step = that layer's
  forward count (starting at the job's committed step + 1), so all ranks
  must run the same layers the same number of times, and every layer whose
  output is used must get its backward on every rank.
* The running statistics are kept by the aggregator; the module's buffers
  mirror them by the same rule (``attach`` seeds a fresh job from them and
  then loads them from the service; ``Session.pull_running_stats`` does
  again). eval() is plain batch norm on
  those buffers, no round.
"""

from ._batch_norm import SyncBatchNorm
from ._convert import convert_sync_batchnorm
from ._session import Session, attach

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm", "attach", "Session"]
