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
  Without arguments it takes what torch.distributed (or RANK, WORLD_SIZE,
  TORCHELASTIC_RUN_ID and SYNCNORM_ADDRESS) says.
* ``rank`` / ``world_size`` are the job's contributors: one per process
  (one GPU or CPU worker each). The layers' ``process_group`` (a torch
  ProcessGroup's ranks, or k consecutive ranks) splits them into groups,
  each with its own statistics.
* Each training forward of a layer is one round with step = that layer's
  forward count (starting at the job's committed step + 1), so all ranks
  must run the same layers the same number of times, and every layer whose
  output is used must get its backward on every rank (in any order).
* The running statistics are kept by the aggregator; the module's buffers
  mirror them. A change to the module (momentum, reset_running_stats,
  load_state_dict, writes to the buffers) goes to the aggregator with the
  layer's next training round. eval() is plain batch norm on the buffers,
  no round.
* ``precise_bn(model, batches)`` recomputes the running statistics after
  training: the exact population statistics of each layer's input at
  inference, over the batches of every rank (see docs/python.md, "Precise
  BN").
"""

from ._batch_norm import SyncBatchNorm
from ._convert import convert_sync_batchnorm
from ._precise_bn import precise_bn
from ._session import Session, attach

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm", "attach", "Session",
           "precise_bn"]
