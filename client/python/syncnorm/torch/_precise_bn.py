"""precise_bn: a trained model's running statistics recomputed exactly over
every sample of every rank ("precise BN", Wu & Johnson, "Rethinking 'Batch'
in BatchNorm", 2021). The merge and the commit are the C++ client's
PreciseBn (client/precise_bn.h), through the extension."""

import itertools

import torch
import torch.nn.functional as F

from .. import _syncnorm
from .._client import ServiceError
from ._batch_norm import SyncBatchNorm
from ._tensors import dense, desc, kernel_dtype, on_device


class _Stop(BaseException):
    """Raised by the hook that captured a pass's layer: the rest of the
    forward is not needed. A BaseException, so that a model's own
    ``except Exception`` does not swallow it."""


def precise_bn(model, batches, num_batches=None, *, one_pass=False,
               forward_fn=None):
    """Sets the running statistics of the model's attached SyncBatchNorm
    layers to the exact population statistics of their input over the
    batches of every rank of their group, and commits them to the job.

    Every rank of the job calls it together, with its own `batches` (an
    iterable; the first `num_batches` are taken, all when None; ranks may
    have different numbers of batches of different sizes). Each batch is
    passed to the model as its single argument, as fvcore's
    update_bn_stats does; ``forward_fn(model, batch)`` runs it otherwise
    (say, ``lambda m, b: m(*b)``). Pass the module itself, not a
    DistributedDataParallel wrapper, whose forward is a collective.

    Default: the statistics the layers see at inference. The layers are
    set one at a time in the order their forwards run; for each, the
    batches run forward in eval mode (the layers before it already hold
    their new statistics) up to the layer only, its input's moments are
    pooled over the batches (float64, Chan's merge), merged over the
    group's ranks by the aggregator, and the layer's running_mean and
    running_var become the population mean and unbiased variance M2 / (N -
    1) on every rank before the next layer's pass. one_pass=True: fvcore's
    one-pass semantics with exact pooled moments in place of averaged
    ones: one pass in which every layer normalizes with its own batch's
    statistics (the running statistics untouched), then every layer is
    set from the moments of its input in that pass.

    Then the group's first member writes every layer's new statistics to
    the job as one new version each (num_batches_tracked: the job's + 1),
    every rank waits for it and loads the job's statistics into its
    buffers. Layers with freeze, use_global_stats or without running
    statistics are left alone, as is a layer no rank's batches reach.
    No gradients are computed, the weights do not change, and the model's
    and every module's training mode are restored. Returns {layer name:
    population count} of the layers set.

    Raises syncnorm.ServiceError when a merge fails (a rank missing:
    DEADLINE_EXCEEDED after the job's round timeout, naming the layer and
    the missing ranks); the job's statistics are then unchanged and every
    surviving rank's buffers are restored bit for bit. ValueError for a
    model without attached layers or with layers of several sessions;
    errors of the model's forward as they are, after the same restore.
    """
    session = _session_of(model)
    if num_batches is not None:
        if num_batches < 0:
            raise ValueError("expected num_batches >= 0 or None, got %r"
                             % (num_batches,))
        batches = itertools.islice(batches, num_batches)
    batches = list(batches)
    forward = forward_fn or (lambda m, b: m(b))
    if any(bn._sn_behind for bn in session.layers):
        session.sync_running_stats()  # a stale job's buffers catch up first
    inside = {id(m) for m in model.modules()}
    targets = [bn for bn in session.layers
               if id(bn) in inside and bn.track_running_stats and
               not (bn.freeze or bn.use_global_stats)]
    # The serial names the scratch job: each rank counts its session's
    # calls, the same on every rank as every rank calls it together.
    serial = getattr(session, "_precise_bn_serial", 0)
    session._precise_bn_serial = serial + 1
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            return _Call(session, targets, serial).go(model, forward, batches,
                                                   one_pass)
    finally:
        for m, mode in modes:
            m.training = mode


def _session_of(model):
    """The one Session of the model's SyncBatchNorm layers."""
    layers = [(n, m) for n, m in model.named_modules()
              if isinstance(m, SyncBatchNorm)]
    if not layers:
        raise ValueError("the model has no syncnorm SyncBatchNorm layer; "
                         "convert it and attach it first")
    sessions = {}
    for name, bn in layers:
        if bn._sn_session is None:
            raise ValueError(
                "SyncBatchNorm '%s' is not attached to a job; precise_bn "
                "merges through the job: call syncnorm.torch.attach(model) "
                "first" % (name or "bn"))
        sessions[id(bn._sn_session)] = bn._sn_session
    if len(sessions) > 1:
        raise ValueError("the model's SyncBatchNorm layers are attached to "
                         "%d sessions; precise_bn takes a model attached "
                         "once" % len(sessions))
    return next(iter(sessions.values()))


class _Call:
    """One call of precise_bn on this rank: the buffers as they were, the
    C++ PreciseBn (merges and commit), and the layers set so far."""

    def __init__(self, session, targets, serial):
        self.session = session
        self.targets = targets
        self.saved = [(bn, bn.running_mean.clone(), bn.running_var.clone(),
                       bn.num_batches_tracked.clone()) for bn in targets]
        self.serial = serial
        self.pbn = None
        self.counts = {}

    def go(self, model, forward, batches, one_pass):
        session = self.session
        # The job's statistics before: after a failed commit they tell
        # whether the job holds the new ones.
        before = session.client.get_running_stats(
            session.job_id, group=session.group_index)
        committing = False
        try:
            self.pbn = _syncnorm.PreciseBn(session.client._raw,
                                           session.job_id, session.rank,
                                           self.serial)
            if one_pass:
                self._one_pass(model, forward, batches)
            else:
                self._layer_by_layer(model, forward, batches)
            committing = True
            self.pbn.commit()
        except BaseException as e:
            restored = self._restore(before if committing else None)
            if self.pbn is not None and not committing:
                _quietly(self.pbn.abort)
            tail = "; this rank's running-statistics buffers are " + restored
            if type(e) is ServiceError:
                raise ServiceError(str(e) + tail, e.code, e.reason) from e
            e.add_note("precise_bn failed" + tail)
            raise
        return self._load_committed()

    # ---- the passes ---------------------------------------------------

    def _layer_by_layer(self, model, forward, batches):
        """One pass per layer, in forward order, each stopping at its
        layer. The forward order is found as the passes go: a pass hooks
        every layer not set yet, and the first to run is the pass's layer
        (the session's order is modules() order, which need not be the
        forward's). A rank whose batches reach none of them (or that has
        none) takes them in the session's order with no values: on ranks
        that reach them the order is the forward's, so the two agree when
        the layers run in modules() order or no rank reaches them."""
        remaining = list(self.targets)
        reached = bool(batches)
        while remaining:
            layer = None
            if reached:
                layer = self._capture_first(model, forward, batches,
                                            remaining)
            if layer is None:
                reached = False  # the same batches will not reach the rest
                layer = remaining[0]
            self._merge(layer)
            remaining.remove(layer)

    def _capture_first(self, model, forward, batches, layers):
        """Runs the batches up to the first of `layers` to run and pools
        its input's moments; that layer, or None when no batch reached
        any."""
        first = []

        def capture(bn, args):
            if not first:
                first.append(bn)
            elif bn is not first[0]:
                raise RuntimeError(
                    "precise_bn: layer '%s' ran before '%s' in one batch and "
                    "after it in another; it needs the layers to run in the "
                    "same order in every batch" % (self._name(bn),
                                                   self._name(first[0])))
            self._add(bn, args[0])
            raise _Stop()

        handles = [bn.register_forward_pre_hook(capture) for bn in layers]
        try:
            for batch in batches:
                try:
                    forward(model, batch)
                except _Stop:
                    pass
        finally:
            for h in handles:
                h.remove()
        return first[0] if first else None

    def _one_pass(self, model, forward, batches):
        """fvcore's pass: every layer normalizes with its batch's
        statistics, its input's moments pooled; then every layer is
        merged."""
        def capture(bn, args):
            self._add(bn, args[0])

        def normalize(bn, args, output):
            return _batch_normalized(bn, *args)

        handles = []
        for bn in self.targets:
            handles.append(bn.register_forward_pre_hook(capture))
            handles.append(bn.register_forward_hook(normalize))
        try:
            for batch in batches:
                forward(model, batch)
        finally:
            for h in handles:
                h.remove()
        for bn in self.targets:
            self._merge(bn)

    # ---- moments, merges, buffers -------------------------------------

    def _add(self, bn, x):
        """Folds one batch's moments of the layer's input (the kernels'
        float64 moments) into this rank's pooled moments."""
        bn._check_input(x, None)
        x = dense(x.detach().to(kernel_dtype(x.dtype, x.device)),
                  bn.channel_last)
        pool, stream = bn._exec(x)
        with on_device(x):
            count, mean, m2 = _syncnorm.local_moments(
                desc(x), bn.channel_last, pool, stream)
        self.pbn.add(bn._sn_layer, count, mean, m2)

    def _merge(self, bn):
        """Merges the layer over the group's ranks; its buffers become the
        population statistics (a layer no rank saw keeps its own)."""
        count, _, mean, var = self.pbn.merge(bn._sn_layer)
        self.counts[bn] = count
        if count:
            bn.running_mean.copy_(torch.from_numpy(mean))
            bn.running_var.copy_(torch.from_numpy(var))

    def _restore(self, before):
        """The buffers as they were, bit for bit; after a failed commit the
        job's statistics where the job holds new ones (the commit went
        through). Returns what the buffers now hold, in words."""
        for bn, mean, var, nbt in self.saved:
            bn.running_mean.copy_(mean)
            bn.running_var.copy_(var)
            bn.num_batches_tracked.copy_(nbt)
        if before is None:
            return "restored as they were"
        try:
            now = self.session.client.get_running_stats(
                self.session.job_id, group=self.session.group_index)
        except ServiceError:
            return ("restored as they were (the job's statistics could not "
                    "be read: pull them with Session.pull_running_stats)")
        old = {e["layer"]: e["num_batches_tracked"] for e in before["layers"]}
        changed = [e for e in now["layers"]
                   if e["num_batches_tracked"] != old.get(e["layer"])]
        for entry in changed:
            self.session.layers[entry["layer"]]._sn_load(entry)
        if changed:
            return "the job's new statistics (the commit went through)"
        return "restored as they were (the job's statistics are unchanged)"

    def _load_committed(self):
        """Loads the job's statistics of the layers set into their buffers
        and returns {name: population count}."""
        layers = [bn for bn in self.targets if self.counts[bn] >= 2]
        if layers:
            stats = self.session.client.get_running_stats(
                self.session.job_id, layers=[bn._sn_layer for bn in layers],
                group=self.session.group_index)
            for entry in stats["layers"]:
                self.session.layers[entry["layer"]]._sn_load(entry)
        return {self._name(bn): int(self.counts[bn]) for bn in layers}

    def _name(self, bn):
        return self.session.names[bn._sn_layer] or "bn"


def _batch_normalized(bn, x, z=None):
    """The layer's output normalized with the statistics of its own
    (local) batch, without touching the running statistics: torch's
    training-mode batch norm, float32 arithmetic for half types as the
    layer's."""
    y = x.movedim(-1, 1) if bn.channel_last and x.dim() > 2 else x
    weight, bias = (None if t is None else t.float()
                    for t in (bn.weight, bn.bias))
    y = F.batch_norm(y.float(), None, None, weight, bias, True, 0.0, bn.eps)
    if bn.channel_last and y.dim() > 2:
        y = y.movedim(1, -1)
    if z is not None:
        y = y + z.float()
    if bn.fuse_relu:
        y = F.relu(y)
    return y.to(x.dtype)


def _quietly(call):
    try:
        call()
    except ServiceError:
        pass  # it failed already; that error is the one to raise
