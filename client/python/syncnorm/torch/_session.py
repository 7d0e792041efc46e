"""attach and Session: a model's SyncBatchNorm layers on a job."""

import torch

from .. import _syncnorm
from .._client import Client
from ._batch_norm import SyncBatchNorm
from ._tensors import host_f64


def _group_size(process_group):
    """A layer's process_group as the job's group_size (0: all ranks)."""
    if process_group is None:
        return 0
    if isinstance(process_group, int):
        return process_group
    size = getattr(process_group, "size", None)
    if callable(size):
        return int(size())
    if isinstance(size, int):
        return size
    raise TypeError(
        "expected process_group None, an int (ranks per group) or an object "
        "with size() such as a torch.distributed ProcessGroup, got %r"
        % (process_group,))


class Session:
    """A model's SyncBatchNorm layers attached to one job as one rank.

    Attributes: client, job_id, rank, world_size, group_size, group_index
    (this rank's group in the job), group (the NodeGroup it syncs through),
    layers (the SyncBatchNorm modules, index = layer), names (their module
    paths), pool (a kernel ThreadPool or None), and sync_seconds (wall time
    spent in forward and backward syncs so far). Used by one training
    thread.
    """

    def __init__(self, client, job_id, rank, world_size, group_size, names,
                 layers, node_group, pool):
        self.client = client
        self.job_id = job_id
        self.rank = rank
        self.world_size = world_size
        self.group_size = group_size
        self.group_index = rank // group_size if group_size else 0
        self.names = names
        self.layers = layers
        self.group = node_group
        self.pool = pool
        self.sync_seconds = 0.0

    def steps(self):
        """The next step of each layer."""
        return [bn._sn_step for bn in self.layers]

    def pull_running_stats(self, checkpoint_step=0):
        """Loads the running statistics (and num_batches_tracked) of this
        rank's group from the aggregator into the layers' buffers."""
        stats = self.client.get_running_stats(
            self.job_id, checkpoint_step=checkpoint_step,
            group=self.group_index)
        for entry in stats.get("layers", []):
            bn = self.layers[entry["layer"]]
            if not bn.track_running_stats:
                continue
            with torch.no_grad():
                bn.running_mean.copy_(torch.tensor(entry["running_mean"]))
                bn.running_var.copy_(torch.tensor(entry["running_var"]))
                bn.num_batches_tracked.fill_(entry["num_batches_tracked"])
        return stats

    def _seed_batch_counts(self):
        """A fresh job starts from the layers' running mean and var (their
        LayerSpec); this carries their num_batches_tracked over too (say, of
        a converted pretrained model), for this rank's group. Every rank of
        the group sends the same values before its first round."""
        entries = []
        for index, bn in enumerate(self.layers):
            if bn.track_running_stats and int(bn.num_batches_tracked) > 0:
                entries.append({
                    "layer": index, "group": self.group_index,
                    "running_mean": host_f64(bn.running_mean).tolist(),
                    "running_var": host_f64(bn.running_var).tolist(),
                    "num_batches_tracked": int(bn.num_batches_tracked)})
        if entries:
            self.client.set_running_stats(self.job_id, entries)

    def checkpoint(self, step=None, tag=""):
        """Checkpoints the job at `step` (default: the last step every layer
        of this rank has run) once every rank has applied it."""
        if step is None:
            step = min(self.steps()) - 1
        return self.client.checkpoint(self.job_id, step, tag)

    def restore(self, step):
        """Rolls the job back to its checkpoint of `step`, reloads the
        buffers from it and continues at step + 1. Every rank calls it."""
        info = self.client.restore(self.job_id, step)
        self.pull_running_stats()
        for bn in self.layers:
            bn._sn_step = step + 1
        return info

    def detach(self):
        for bn in self.layers:
            bn._sn_session = None
            bn._sn_layer = -1


def _dry_run(model, example_input):
    """One eval forward without gradients, to infer in_channels=0 layers."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            if isinstance(example_input, (tuple, list)):
                model(*example_input)
            else:
                model(example_input)
    finally:
        for m, flag in flags:
            m.training = flag


def attach(model, client, job_id, rank, world_size, *, group_size=None,
           round_timeout_ms=0, example_input=None, start_step=None,
           num_threads=None, node_group=None, quorum=None):
    """Attaches every SyncBatchNorm of `model` to the job `job_id` as `rank`
    of `world_size` and returns the :class:`Session`.

    client: a :class:`syncnorm.Client` or an address "host:port". Creates
    the job (idempotent; each rank sends the same spec) with one layer per
    SyncBatchNorm in model.modules() order, then loads the buffers from the
    aggregator; a fresh job starts from the model's running statistics,
    num_batches_tracked included. group_size: ranks per group (default:
    the layers' process_group, else all ranks). example_input: run once in
    eval mode first, so that in_channels=0 layers learn their channel count
    (without it, such layers must have seen input before). start_step:
    each layer's first step (default: the job's committed step + 1, which
    resumes a restored job). num_threads: CPU threads for the kernels
    (default: the caller's thread only). node_group: a NodeGroup to sync
    through instead of this rank's own Reduce stream (e.g. a ThreadNode
    member). quorum: the job's QuorumPolicy, {"min_ranks": k, "grace_ms":
    t} (see :meth:`syncnorm.Client.create_job`); each layer's
    ``last_missing_ranks`` then names the ranks its last round went
    without.
    """
    if example_input is not None:
        _dry_run(model, example_input)
    named = [(n, m) for n, m in model.named_modules()
             if isinstance(m, SyncBatchNorm)]
    if not named:
        raise ValueError("the model has no syncnorm SyncBatchNorm layer; "
                         "convert it with convert_sync_batchnorm first")
    if not 0 <= rank < world_size:
        raise ValueError("expected 0 <= rank < world_size, got rank %d of %d"
                         % (rank, world_size))
    if group_size is None:
        sizes = {_group_size(m.process_group) for _, m in named}
        if len(sizes) > 1:
            raise ValueError("the layers name different process groups "
                             "(group sizes %s); one job has one group size"
                             % sorted(sizes))
        group_size = sizes.pop()
    if group_size and world_size % group_size:
        raise ValueError("expected world_size %d to be a multiple of the "
                         "group size %d" % (world_size, group_size))
    if isinstance(client, str):
        client = Client(client)
    specs = [m.layer_spec(n or "bn") for n, m in named]
    info = client.create_job(job_id, world_size, specs, group_size,
                             round_timeout_ms, quorum)
    if node_group is None:
        node_group = client.node_group(job_id, rank)
    pool = _syncnorm.ThreadPool(num_threads) if num_threads else None
    session = Session(client, job_id, rank, world_size, group_size,
                      [n for n, _ in named], [m for _, m in named],
                      node_group, pool)
    first = info["committed_step"] + 1 if start_step is None else start_step
    for index, ((_, bn), spec) in enumerate(zip(named, info["layers"])):
        bn._sn_session = session
        bn._sn_layer = index
        bn._sn_step = first
        bn._sn_rule = bn._rule(spec)
    if info["committed_step"] < 0:
        session._seed_batch_counts()
    session.pull_running_stats()
    return session
