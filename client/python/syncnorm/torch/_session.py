"""attach and Session: a model's SyncBatchNorm layers on a job."""

import logging
import os
import time

import torch

from .. import _syncnorm
from .._client import Client, group_of, member_since
from . import _create, _joinable
from ._batch_norm import SyncBatchNorm

_log = logging.getLogger("syncnorm")


class Session(_joinable.Joinable):
    """A model's SyncBatchNorm layers attached to one job as one rank.

    Attributes: client, job_id, rank, world_size, group_index (this rank's
    group in the job), group_ranks (the ranks of that group, ascending),
    group (the NodeGroup it syncs through), layers (the SyncBatchNorm
    modules, index = layer), names (their module paths), pool (a kernel
    ThreadPool or None), sync_seconds (wall time spent in forward and
    backward syncs so far), first_step (the layers' first step when
    attached), joined (whether attach made this rank a member of an
    elastic job) and staleness (the job's bound, 0: synchronous). Used by
    one training thread.

    A torch.distributed.algorithms.join.Joinable: under ``with
    Join([ddp_model, session]):`` (or ``Join([session])``) ranks train
    different numbers of batches. A rank that has run out is absent from
    the job from its next step, so the others' rounds complete without it;
    when every rank has run out, every rank leaves the context at one step,
    the next after the longest rank's last, with the service's statistics
    in its buffers. Join's process group is torch.distributed's default
    group (DDP's default).
    """

    def __init__(self, client, job_id, rank, world_size, info, names, layers,
                 node_group, pool):
        super().__init__()
        self.client = client
        self.job_id = job_id
        self.rank = rank
        self.world_size = world_size
        self.group_index = group_of(info, rank)
        if info.get("groups"):
            self.group_ranks = tuple(info["groups"][self.group_index]["ranks"])
        else:
            k = info["group_size"] or world_size
            first = self.group_index * k
            self.group_ranks = tuple(range(first, first + k))
        self.group_size = len(self.group_ranks)
        self.names = names
        self.layers = layers
        self.group = node_group
        self.pool = pool
        self.sync_seconds = 0.0
        self.first_step = 0
        self.joined = False
        self.staleness = int(info.get("staleness", 0))
        # Under Join: the step this rank left the job from (None: a member)
        # and the attached model's forward pre-hook that notifies Join.
        self._join_left = None
        self._join_notice = None
        self._model = None
        # Statistics health: seconds between polls from the training
        # thread (0: never), the last poll, and the flags warned about.
        self.health_interval = 30.0
        self._health_polled = time.monotonic()
        self._health_warned = set()

    def stats_health(self):
        """The job's statistics health (syncnorm.Client.stats_health): the
        ranks whose statistics disagree with their group's, stuck and dead
        channels, non-finite contributions per rank."""
        return self.client.stats_health(self.job_id)

    def _poll_health(self):
        """From the first layer's forward, every health_interval seconds:
        a warning through logging ("syncnorm") for each flag raised since,
        on rank 0 and on the flagged rank. A failed poll is logged at
        debug level and retried at the next interval."""
        if not self.health_interval:
            return
        now = time.monotonic()
        if now - self._health_polled < self.health_interval:
            return
        self._health_polled = now
        try:
            health = self.stats_health()
        except Exception as e:  # a poll must never fail a training step
            _log.debug("statistics health of job %s: %s", self.job_id, e)
            return
        for flag in health.get("flags", []):
            if not flag.get("active"):
                continue
            key = (flag.get("kind"), flag.get("layer", 0),
                   flag.get("group", 0), flag.get("rank", 0),
                   flag.get("channel", 0), flag.get("first_step", 0))
            if key in self._health_warned:
                continue
            self._health_warned.add(key)
            rank = flag.get("rank", 0)
            if self.rank != 0 and rank != self.rank:
                continue
            channel = flag.get("channel", -1)
            _log.warning(
                "statistics health: %s of job %s, layer %d (%s), group %d: "
                "%s%s from step %d (score %.3g); see syncnormctl health %s",
                "the layer" if rank < 0 else "rank %d" % rank, self.job_id,
                flag.get("layer", 0), flag.get("layer_name", ""),
                flag.get("group", 0), flag.get("kind", "").lower(),
                " of channel %d" % channel if channel >= 0 else "",
                flag.get("first_step", 0), flag.get("score", 0.0),
                self.job_id)

    def join_hook(self, **kwargs):
        """The JoinHook torch's Join runs on a rank that has run out of
        data (torch.distributed.algorithms.join.Joinable)."""
        return _joinable.hook(self)

    @property
    def join_device(self):
        """Where Join's counts are reduced: the current CUDA device under
        NCCL, else the CPU."""
        dist = _distributed()
        if dist is not None and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def join_process_group(self):
        """torch.distributed's default group, as DDP's by default."""
        return torch.distributed.group.WORLD

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
            self.layers[entry["layer"]]._sn_load(entry)
        return stats

    def sync_running_stats(self, timeout=None):
        """Loads the aggregator's statistics of this rank's group into every
        layer's buffers once they hold every step this rank has run: waits
        (at most `timeout` seconds, default the client's rpc_timeout; then
        TimeoutError) until the job has committed the last step any layer
        ran. In a stale-synchronous job the buffers lag between such loads;
        eval, freeze and state_dict() call it when a layer lags. Returns
        the RunningStats dict."""
        last = max(self.steps()) - 1
        if timeout is None:
            timeout = getattr(self.client, "rpc_timeout", 30.0)
        if last >= 0:
            stats = _await_committed(
                self.client, self.job_id, self.group_index, last, timeout,
                "this rank ran step %d, whose statistics wait for every "
                "member of its group (is the slowest training?)" % last)
        else:
            stats = self.client.get_running_stats(self.job_id,
                                                  group=self.group_index)
        for entry in stats.get("layers", []):
            self.layers[entry["layer"]]._sn_load(entry)
        return stats

    def last_view(self, layer):
        """The view of a layer's last training round (its index or module
        name): the (rank, step) pairs the answer merged, in rank order; ()
        in a synchronous job."""
        if isinstance(layer, str):
            if layer not in self.names:
                raise KeyError("no SyncBatchNorm named %r; the session's "
                               "layers are %s" % (layer, self.names))
            layer = self.names.index(layer)
        return self.layers[layer].last_view

    def push_running_stats(self):
        """Sends the buffers that differ from the aggregator's statistics
        (loaded, reset or written since the layer's last round) to the
        aggregator now, for this rank's group, instead of with the next
        training round (say, before eval or a checkpoint elsewhere). Call it
        on one rank of the group, or on every rank with the same buffers.
        Returns the number of layers sent."""
        return self._push_layers(self.layers)

    def _push_layers(self, layers):
        """push_running_stats of `layers` (of this session)."""
        entries, changed = [], []
        for bn in layers:
            index = bn._sn_layer
            if not bn.track_running_stats:
                continue
            imported = bn._changed_buffers()
            # A layer that runs no rounds says so (the job's committed step
            # does not wait for it), and one that runs them again too.
            frozen = bn._runs_no_rounds()
            if imported is None:
                if frozen == bn._sn_frozen_known:
                    continue
                imported = bn._buffers_as_import()
            nbt, mean, var = imported
            entries.append({"layer": index, "group": self.group_index,
                            "running_mean": mean.tolist(),
                            "running_var": var.tolist(),
                            "num_batches_tracked": nbt,
                            "frozen": frozen})
            changed.append(bn)
        if entries:
            stats = self.client.set_running_stats(self.job_id, entries)
            for bn, entry in zip(changed, stats["layers"]):
                bn._sn_load(entry)
        return len(entries)

    def _reload_layer(self, bn):
        """Loads one layer's statistics from the aggregator."""
        stats = self.client.get_running_stats(
            self.job_id, layers=[bn._sn_layer], group=self.group_index)
        bn._sn_load(stats["layers"][0])

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

    def leave(self):
        """Leaves the job gracefully and detaches: this rank takes part in
        every round before its layers' next step (the step after the last
        it ran) and in none from it, and the layers no longer sync.
        Returns the job's JobInfo dict with the new membership. Call it
        between steps, after the backward of the last."""
        step = max(self.steps())
        info = self.client.update_membership(self.job_id, step=step,
                                             leave=[self.rank])
        self.detach()
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


def _distributed():
    """torch.distributed when it is initialized, else None."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _env_int(name):
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError("expected an integer in the environment variable "
                         "%s, got %r" % (name, value)) from None


def _launch(client, job_id, rank, world_size):
    """The client, job id, rank and world size: the arguments given, else
    torch.distributed's (rank, world size) or the environment's (RANK,
    WORLD_SIZE, TORCHELASTIC_RUN_ID, SYNCNORM_ADDRESS)."""
    dist = _distributed()
    if rank is None:
        rank = dist.get_rank() if dist else _env_int("RANK")
    if world_size is None:
        world_size = dist.get_world_size() if dist else _env_int("WORLD_SIZE")
    if rank is None or world_size is None:
        raise ValueError(
            "attach needs this process's rank and the world size: pass rank= "
            "and world_size=, call torch.distributed.init_process_group "
            "first, or set RANK and WORLD_SIZE (torchrun sets them)")
    if job_id is None:
        job_id = os.environ.get("TORCHELASTIC_RUN_ID")
        if job_id is None:
            raise ValueError(
                "attach needs a job id shared by every rank of the run: pass "
                "job_id=, or launch with torchrun (it sets "
                "TORCHELASTIC_RUN_ID)")
        if job_id == "none":
            raise ValueError(
                "TORCHELASTIC_RUN_ID is 'none', torchrun's default without "
                "--rdzv_id, which every such run shares; launch with "
                "--rdzv_id=<a unique run id> (or --standalone), or pass "
                "job_id=")
    if client is None:
        client = os.environ.get("SYNCNORM_ADDRESS")
        if not client:
            raise ValueError(
                "attach needs the aggregator: pass client= (a syncnorm.Client "
                "or 'host:port'), or set SYNCNORM_ADDRESS")
    if isinstance(client, str):
        client = Client(client)
    return client, job_id, int(rank), int(world_size)


def _process_group_ranks(pg):
    """The global ranks of a torch ProcessGroup, ascending; None for an
    object that is not one."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return None
    if not isinstance(pg, dist.ProcessGroup):
        return None
    if hasattr(dist, "get_process_group_ranks"):
        return sorted(dist.get_process_group_ranks(pg))
    return sorted(dist.distributed_c10d._pg_group_ranks[pg])


def _grouping(process_group):
    """A layer's process_group as ("all",), ("size", k) or ("ranks", list of
    this rank's group's global ranks)."""
    if process_group is None:
        return ("all",)
    if isinstance(process_group, int):
        return ("size", process_group)
    ranks = _process_group_ranks(process_group)
    if ranks is not None:
        return ("ranks", tuple(ranks))
    size = getattr(process_group, "size", None)
    if callable(size):
        return ("size", int(size()))
    raise TypeError(
        "expected process_group None, a torch.distributed ProcessGroup or an "
        "int (ranks per group, apex's group_size), got %r" % (process_group,))


def _groups(named, rank, world_size):
    """(group_size, groups) of the job from the layers' process groups."""
    kinds = {_grouping(m.process_group) for _, m in named}
    if len(kinds) > 1:
        raise ValueError(
            "the layers name different process groups (%s); syncnorm groups "
            "a job's ranks one way for all its layers: give every layer the "
            "same process_group" % sorted(kinds, key=str))
    kind = kinds.pop()
    if kind[0] == "all":
        return 0, None
    if kind[0] == "size":
        return kind[1], None
    mine = list(kind[1])
    if len(mine) == world_size:
        return 0, None
    dist = _distributed()
    if dist is None or dist.get_rank() != rank or \
            dist.get_world_size() != world_size:
        raise ValueError(
            "the layers' process_group lists torch.distributed global ranks, "
            "so the job's ranks must be those: attach got rank %d of %d, "
            "torch.distributed has %s" % (
                rank, world_size,
                "not been initialized" if dist is None else "rank %d of %d" % (
                    dist.get_rank(), dist.get_world_size())))
    if rank not in mine:
        raise ValueError("rank %d passed a process group without it (ranks "
                         "%s); pass each rank its own group" % (rank, mine))
    # Each rank knows its own group only: every rank's goes to every rank
    # (a collective over the default group, as every rank attaches).
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return 0, sorted({tuple(g) for g in everyone})


def _await_committed(client, job_id, group, step, timeout, why=None):
    """Waits until the job's committed step reaches `step`; the statistics
    then hold every round before step + 1. `why` ends the TimeoutError's
    message (default: a joining rank's)."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        stats = client.get_running_stats(job_id, group=group)
        if stats.get("step", -1) >= step:
            return stats
        if time.monotonic() + pause >= deadline:
            if why is None:
                why = ("a rank joining at step %d waits for step %d to load "
                       "the statistics it starts from (are its members "
                       "training?)" % (step + 1, step))
            raise TimeoutError("job %r has committed step %d after %g s; %s"
                               % (job_id, stats.get("step", -1), timeout,
                                  why))
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _join(client, job_id, rank, info):
    """(JobInfo, joined, first step of the rank as a member) of an elastic
    job, joining it at its next step when the rank is not a member."""
    since = member_since(info, rank)
    if since is not None:
        return info, False, since
    info = client.update_membership(job_id, join=[rank])
    return info, True, member_since(info, rank)


def attach(model, client=None, job_id=None, rank=None, world_size=None, *,
           group_size=None, groups=None, round_timeout_ms=0,
           example_input=None, start_step=None, num_threads=None,
           node_group=None, quorum=None, members=None, join_timeout=60.0,
           staleness=0, stats_health=True):
    """Attaches every SyncBatchNorm of `model` to the job `job_id` as `rank`
    of `world_size` and returns the :class:`Session`.

    Like torch.nn.SyncBatchNorm, it needs nothing but a launched process:
    rank and world_size default to torch.distributed's when it is
    initialized, else to $RANK and $WORLD_SIZE; job_id to
    $TORCHELASTIC_RUN_ID (torchrun's run id); client to $SYNCNORM_ADDRESS.
    Arguments given win.

    client: a :class:`syncnorm.Client` or an address "host:port". Creates
    the job (idempotent; each rank sends the same spec) with one layer per
    SyncBatchNorm in model.modules() order. A new job starts from the
    model's running statistics (num_batches_tracked too): rank 0's when
    torch.distributed is initialized (every rank's buffers become rank
    0's first, a collective, so a checkpoint loaded on rank 0 alone is
    every rank's start, as with DDP). A job that exists and has not
    trained keeps its initial statistics; a job that has trained (resumed,
    or attached again from a reloaded model) loads its statistics into the
    buffers. A job that exists with another spec raises ServiceError
    ALREADY_EXISTS naming what differs. Groups: the layers' process_group (a
    torch ProcessGroup: its ranks; an int k: blocks of k consecutive
    ranks), or group_size, or groups (rank lists, every rank in one).
    example_input: run once in eval mode first, so that in_channels=0
    layers learn their channel count (without it, such layers must have
    seen input before). start_step: each layer's first step (default: the
    job's committed step + 1, which resumes a restored job). num_threads:
    CPU threads for the kernels (default: the caller's thread only).
    node_group: a NodeGroup to sync through instead of this rank's own
    Reduce stream (e.g. a ThreadNode member). quorum: the job's
    QuorumPolicy, {"min_ranks": k, "grace_ms": t} (see
    :meth:`syncnorm.Client.create_job`); each layer's
    ``last_missing_ranks`` then names the ranks its last round went
    without.

    Elastic jobs (members that change at step boundaries): members, the
    ranks that contribute from step 0 when this call creates the job;
    world_size is then the rank space (every rank that may ever join is
    below it). Like the model, it is part of the job's spec: every rank
    passes the same, joiners too. A rank that is not a member when it attaches joins at the
    job's next step (Client.update_membership): it waits (at most
    join_timeout seconds) until every step before that is committed,
    loads the service's running statistics into the buffers and starts
    its layers at that step (Session.joined, Session.first_step). A rank
    that joined earlier (say, by syncnormctl join) starts at its join
    step. Session.leave() leaves gracefully.

    staleness: the job's bound tau (0, the default: synchronous; see
    :meth:`syncnorm.Client.create_job`), part of its spec like the model.
    With tau > 0 a fast rank runs up to tau steps ahead of the slowest of
    its group; each layer's ``last_view`` (or Session.last_view) names what
    its last round merged. The buffers are not updated by the rounds but
    loaded from the aggregator when used: eval, state_dict() and
    Session.sync_running_stats() wait for every member to reach this
    rank's step and load them (see SyncBatchNorm).

    stats_health: the service watches every rank's statistics against its
    group's (Session.stats_health(); a warning through logging when a
    rank is flagged, polled every Session.health_interval seconds, 30 by
    default, 0: never). False turns it off for the job, for ranks that
    see differently distributed data by design; part of the spec.
    """
    if example_input is not None:
        _dry_run(model, example_input)
    named = [(n, m) for n, m in model.named_modules()
             if isinstance(m, SyncBatchNorm)]
    if not named:
        raise ValueError("the model has no syncnorm SyncBatchNorm layer; "
                         "convert it with convert_sync_batchnorm first")
    client, job_id, rank, world_size = _launch(client, job_id, rank,
                                               world_size)
    if not 0 <= rank < world_size:
        raise ValueError("expected 0 <= rank < world_size, got rank %d of %d"
                         % (rank, world_size))
    if groups is not None and group_size is not None:
        raise ValueError("give group_size or groups, not both")
    if groups is None and group_size is None:
        group_size, groups = _groups(named, rank, world_size)
    group_size = group_size or 0
    if group_size and world_size % group_size:
        raise ValueError("expected world_size %d to be a multiple of the "
                         "group size %d" % (world_size, group_size))
    dist = _distributed()
    decided = members is None and dist is not None and \
        dist.get_rank() == rank and dist.get_world_size() == world_size
    if decided:
        # A checkpoint loaded on rank 0 alone: every rank starts from rank
        # 0's statistics (a collective; an elastic joiner attaches alone).
        _create.take_rank0_buffers(dist, [m for _, m in named])
    specs = [m.layer_spec(n or "bn") for n, m in named]
    info, take_service = _create.create_job(
        client, job_id, world_size, specs, decided, group_size=group_size,
        round_timeout_ms=round_timeout_ms, quorum=quorum, groups=groups,
        members=members, staleness=staleness, stats_health=stats_health)
    # An aggregator without elastic membership reports none: every rank.
    elastic = "membership" in info
    joined, since = False, 0
    if elastic:
        info, joined, since = _join(client, job_id, rank, info)
    if node_group is None:
        node_group = client.node_group(job_id, rank)
    pool = _syncnorm.ThreadPool(num_threads) if num_threads else None
    session = Session(client, job_id, rank, world_size, info,
                      [n for n, _ in named], [m for _, m in named],
                      node_group, pool)
    first = info["committed_step"] + 1 if start_step is None else start_step
    if start_step is None and since > first:
        first = since  # a member from a step the job has not reached
    session.first_step = first
    session.joined = joined
    session._model = model
    for index, ((_, bn), spec) in enumerate(zip(named, info["layers"])):
        bn._sn_attach(session, index, first, spec)
    if joined or since > info["committed_step"] + 1:
        # It starts from the statistics after every step before its first,
        # which a layer may still be finishing; they replace the buffers.
        stats = _await_committed(client, job_id, session.group_index,
                                 first - 1, join_timeout)
        for entry in stats.get("layers", []):
            session.layers[entry["layer"]]._sn_load(entry)
        return session
    stats = client.get_running_stats(job_id, group=session.group_index)
    for entry in stats.get("layers", []):
        session.layers[entry["layer"]]._sn_load(
            entry, None if take_service else info["layers"][entry["layer"]])
    # A new job of a pretrained model: its layers that run no round send
    # their buffers now (the others' go with their first round).
    for bn in session.layers:
        bn._sn_push_frozen()
    return session
