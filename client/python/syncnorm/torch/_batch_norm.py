"""SyncBatchNorm: the module."""

import time
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .. import _syncnorm
from .._client import (SingleValuePerChannelError, layer_spec,
                       momentum_mode_code)
from ._function import SyncBatchNormFunction
from ._tensors import (DTYPE_CODES, dense, host_f64, initial, kernel_dtype,
                       like)


class SyncBatchNorm(_BatchNorm):
    r"""Batch norm over the global batch of every rank, synced by syncnorm.

    torch's signature first (``torch.nn.SyncBatchNorm``), then:

    * apex: ``channel_last`` (input is (N, ..., C); an (N, C, ...) input in
      torch's channels_last memory format works without it), ``fuse_relu``
      and the residual ``z`` of ``forward(input, z)``: y = relu(bn(x) + z).
    * MegEngine: ``freeze`` (normalize with the running statistics, no
      round and no update, and gamma/beta frozen too: they get no
      gradient) and ``momentum_mode="megengine"`` (running = m * running +
      (1 - m) * batch, with momentum=0.9 as MegEngine's default).
    * MXNet: ``center`` / ``scale`` (beta / gamma separately),
      ``use_global_stats`` (normalize with the running statistics, no
      round and no update; gamma/beta learn), ``in_channels`` (= num_features;
      0 infers the channel count at the first forward), ``momentum_mode=
      "mxnet"`` and the initializers ``gamma_initializer``,
      ``beta_initializer``, ``running_mean_initializer`` and
      ``running_variance_initializer`` (a number, "zeros", "ones", a
      torch.nn.init-style callable or C values).
    * ``biased_running_var``: running var from the biased M2/n (default:
      torch's unbiased n/(n-1)).

    ``last_missing_ranks``: the ranks (job ranks, ascending, a tuple of
    ints) that this layer's last training round did not count, because
    the job's quorum (``attach(..., quorum=...)``) completed it without
    them; this rank's own when its contribution came too late. Empty when
    every rank was counted, before the first round and after a failed one
    (whose ServiceError names the missing ranks); eval and freeze, which
    run no round, leave it as it was. ``last_forward_sync`` and
    ``last_backward_sync``: seconds the last rounds took.

    Stale-synchronous jobs (``attach(..., staleness=tau)``, tau > 0):
    ``last_view`` holds the (rank, step) pairs whose contributions the last
    training round merged, in rank order (empty in synchronous jobs). Such
    an answer is not the step's full merge, which the aggregator applies
    to the running statistics later, once every member has sent the step;
    so the buffers are not updated by the rounds. They are loaded from the
    aggregator, after it has applied every step this rank ran, when the
    layer normalizes with them (eval, freeze), when the model's
    ``state_dict()`` is taken, and by ``Session.sync_running_stats()``;
    each waits for the slowest member to reach this rank's last step (at
    most tau steps behind). Between those the buffers lag. A stale job
    takes no per-round momentum: changing ``momentum`` after attach raises
    ValueError, as does a buffer changed by hand (load it with
    ``Session.push_running_stats()`` instead).

    As in torch, ``momentum`` is read at every training forward (None is
    torch's cumulative average), and the running-statistics buffers may be
    reset, loaded or written at any time (reset_running_stats,
    load_state_dict, torch.optim.swa_utils.update_bn): the next training
    round sends the momentum and the changed buffers to the aggregator,
    which applies the round to them, so the buffers always equal the
    aggregator's statistics. process_group: None (all ranks of the job), a
    torch ProcessGroup (its ranks, from torch.distributed, form the group;
    every rank passes its own), or an int k (apex's group_size: groups of k
    consecutive ranks); each group keeps its own statistics.

    Input is 2-D to 5-D, float32, float16 or bfloat16, on the CPU (CUDA
    tensors need a build with the CUDA kernels). Its parameters and buffers
    and its state_dict keys are torch's BatchNorm's (weight, bias,
    running_mean, running_var, num_batches_tracked). In training the module
    must be attached to a job (:func:`attach`); eval() needs no service.
    A forward that runs no round (eval, freeze, use_global_stats) is
    torch's F.batch_norm on the buffers: it differentiates to any order,
    and torch.jit.trace, torch.jit.script and torch.onnx.export take it
    with the buffers as buffers. A training layer differentiates to any
    order too: each backward through a forward is its own round
    (retain_graph=True), and a backward with create_graph=True (a gradient
    penalty) is differentiable, its derivative synced through rounds of
    its own (exact on the concatenated batch, where torch's SyncBatchNorm
    raises).
    """

    # Python-only (the service's spec); a scripted module has no use for it.
    __jit_unused_properties__ = ["momentum_mode"]

    def __init__(self, num_features=0, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None,
                 dtype=None, *, channel_last=False, fuse_relu=False,
                 momentum_mode=None, freeze=False, center=True, scale=True,
                 use_global_stats=False, in_channels=0,
                 gamma_initializer="ones", beta_initializer="zeros",
                 running_mean_initializer="zeros",
                 running_variance_initializer="ones",
                 biased_running_var=False):
        torch.nn.Module.__init__(self)
        num_features = int(num_features or in_channels)
        if num_features < 0:
            raise ValueError("expected num_features >= 0 (0: inferred at the "
                             "first forward), got %d" % num_features)
        family = momentum_mode_code(momentum_mode or "torch")
        if family == 3:  # "cumulative" is torch's momentum=None
            family, momentum = 1, None
        if (freeze or use_global_stats) and not track_running_stats:
            raise ValueError("freeze / use_global_stats normalize with the "
                             "running statistics; they need "
                             "track_running_stats=True")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self._momentum_family = family
        self.affine = affine
        self.track_running_stats = track_running_stats
        self.process_group = process_group
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu
        self.freeze = bool(freeze)
        self.use_global_stats = bool(use_global_stats)
        self.biased_running_var = biased_running_var
        self._has_weight = affine and scale
        self._has_bias = affine and center
        self._initializers = (gamma_initializer, beta_initializer,
                              running_mean_initializer,
                              running_variance_initializer)
        self._factory = {"device": device, "dtype": dtype}
        self._sn_session = None
        self._sn_layer = -1
        self._sn_step = 0
        # The aggregator's statistics of this layer (and rank's group) as
        # last known, float64: (num_batches_tracked, mean, var). The
        # buffers equal them cast to their dtype, unless changed since.
        self._sn_stats = None
        # The buffers' tensors and versions when a frozen layer last found
        # them equal to the aggregator's statistics (_sn_push_frozen).
        self._sn_frozen_stamp = None
        # Whether the aggregator knows this layer runs no rounds (its
        # LayerStats "frozen", as last known): the job's committed step
        # then does not wait for it.
        self._sn_frozen_known = False
        self.last_forward_sync = 0.0
        self.last_backward_sync = 0.0
        self.last_missing_ranks = ()
        self.last_view = ()
        # A stale-synchronous job's rounds moved the aggregator's
        # statistics past _sn_stats (the buffers lag until loaded).
        self._sn_behind = False
        self._allocate(num_features)

    @property
    def momentum_mode(self):
        """The running-statistics rule of the next round: 1 (torch), 2
        (decay: MegEngine, MXNet) or 3 (cumulative: momentum is None)."""
        return 3 if self.momentum is None else self._momentum_family

    @momentum_mode.setter
    def momentum_mode(self, mode):
        code = momentum_mode_code(mode)
        if code == 3:
            self.momentum = None
        else:
            self._momentum_family = code

    # ---- parameters and buffers -------------------------------------------

    def _allocate(self, channels):
        gamma, beta, mean, var = (
            initial(v, channels, n) for v, n in zip(
                self._initializers,
                ("gamma_initializer", "beta_initializer",
                 "running_mean_initializer", "running_variance_initializer")))
        factory = {k: v for k, v in self._factory.items() if v is not None}

        def param(values):
            return torch.nn.Parameter(values.to(**factory))

        self.register_parameter(
            "weight", param(gamma) if self._has_weight else None)
        self.register_parameter(
            "bias", param(beta) if self._has_bias else None)
        if self.track_running_stats:
            self.register_buffer("running_mean", mean.to(**factory))
            self.register_buffer("running_var", var.to(**factory))
            self.register_buffer("num_batches_tracked",
                                 torch.tensor(0, dtype=torch.long,
                                              device=factory.get("device")))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def _materialize(self, channels, like):
        """Gives an in_channels=0 layer its C channels, keeping the
        Parameter objects (an optimizer built earlier still holds them)."""
        self._factory["device"] = like.device
        old = (self.weight, self.bias)
        self.num_features = channels
        self._allocate(channels)
        for name, prev in zip(("weight", "bias"), old):
            new = getattr(self, name)
            if prev is not None and new is not None:
                prev.data = new.data
                setattr(self, name, prev)

    def reset_running_stats(self):
        if self.track_running_stats:
            _, _, mean, var = self._initializers
            self.running_mean.copy_(initial(mean, self.num_features,
                                             "running_mean_initializer"))
            self.running_var.copy_(initial(var, self.num_features,
                                            "running_variance_initializer"))
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        self.reset_running_stats()
        with torch.no_grad():
            if self.weight is not None:
                self.weight.copy_(initial(self._initializers[0],
                                           self.num_features,
                                           "gamma_initializer"))
            if self.bias is not None:
                self.bias.copy_(initial(self._initializers[1],
                                         self.num_features,
                                         "beta_initializer"))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.num_features == 0:
            for key in ("weight", "bias", "running_mean", "running_var"):
                if prefix + key in state_dict:
                    t = state_dict[prefix + key]
                    self._materialize(t.numel(), t)
                    break
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # A stale-synchronous job's buffers lag: state_dict holds the
        # aggregator's statistics after every step this rank ran.
        self._sn_catch_up()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _sn_catch_up(self):
        """Loads the aggregator's statistics into the buffers of every layer
        of the session when this one lags (a stale-synchronous job)."""
        if self._sn_behind and self._sn_session is not None:
            self._sn_session.sync_running_stats()

    def _sn_push_frozen(self):
        """A layer that runs no round (freeze, use_global_stats) sends its
        buffers to the aggregator as soon as they differ from its
        statistics (a pretrained model's at attach, a load_state_dict
        later), as no round would carry them: the service's copy of every
        layer is its buffers. Buffers unchanged since the last look (their
        tensors and versions) are not compared again."""
        if not (self.freeze or self.use_global_stats) or \
                self._sn_session is None or self._sn_stats is None or \
                not self.track_running_stats:
            return
        stamp = _stamp(self.running_mean, self.running_var,
                       self.num_batches_tracked)
        if stamp == self._sn_frozen_stamp and self._sn_frozen_known:
            return
        self._sn_session._push_layers([self])
        self._sn_frozen_stamp = _stamp(self.running_mean, self.running_var,
                                       self.num_batches_tracked)

    def __getstate__(self):
        state = super().__getstate__()
        state = dict(state)
        # A connection does not pickle or copy: a reloaded or copied model
        # is attached again (attach resumes the job).
        state["_sn_session"] = None
        state["_sn_stats"] = None
        state["_sn_behind"] = False
        state["_sn_frozen_stamp"] = None
        state["_sn_frozen_known"] = False
        return state

    def __setstate__(self, state):
        # Modules pickled before momentum was read per forward kept the
        # rule as momentum_mode (3: cumulative) and had no use_global_stats.
        old_mode = state.pop("momentum_mode", 1)
        state.setdefault("_momentum_family", old_mode if old_mode == 2 else 1)
        state.setdefault("use_global_stats", False)
        state.setdefault("_sn_stats", None)
        state.setdefault("_sn_behind", False)
        state.setdefault("_sn_frozen_stamp", None)
        state.setdefault("_sn_frozen_known", False)
        state.setdefault("last_view", ())
        super().__setstate__(state)

    def extra_repr(self):
        text = super().extra_repr()
        extras = []
        if self.channel_last:
            extras.append("channel_last=True")
        if self.fuse_relu:
            extras.append("fuse_relu=True")
        if self.freeze:
            extras.append("freeze=True")
        if self.use_global_stats:
            extras.append("use_global_stats=True")
        if self.momentum_mode != 1 and self.momentum is not None:
            extras.append("momentum_mode=%s" % (
                "decay" if self.momentum_mode == 2 else "cumulative"))
        if self._sn_layer >= 0:
            extras.append("layer=%d" % self._sn_layer)
        return ", ".join([text] + extras)

    # ---- the spec the aggregator keeps ------------------------------------

    def layer_spec(self, name):
        """This layer's LayerSpec dict; the running statistics it starts
        from are the current buffers."""
        if self.num_features == 0:
            raise ValueError(
                "layer '%s' has in_channels=0 and has not seen input yet; "
                "pass example_input= to attach, or run one forward in eval "
                "mode before attaching" % name)
        mean, var = (), ()
        if self.track_running_stats:
            if bool((self.running_mean != 0).any()):
                mean = host_f64(self.running_mean).tolist()
            if bool((self.running_var != 1).any()):
                var = host_f64(self.running_var).tolist()
        return layer_spec(name, self.num_features, self.momentum_mode,
                          -1.0 if self.momentum is None else self.momentum,
                          self.track_running_stats, self.biased_running_var,
                          mean, var)

    def _sn_attach(self, session, layer, step, spec):
        """Joins `session` as `layer` of its job, whose LayerSpec is `spec`;
        the first round is `step`."""
        self._sn_session = session
        self._sn_layer = layer
        self._sn_step = step
        self._sn_rule = (momentum_mode_code(spec["momentum_mode"]),
                         float(spec["momentum"]),
                         bool(spec["biased_running_var"]),
                         not spec["no_running_stats"])
        self._sn_stats = None
        self._sn_behind = False
        self._sn_frozen_stamp = None
        self._sn_frozen_known = False
        self.last_view = ()

    def _sn_load(self, entry, spec=None):
        """Takes the aggregator's statistics (a LayerStats dict) as known.
        The buffers become them, except for a layer that has not moved from
        the job's initial statistics (`spec` given): its buffers (say, a
        pretrained model's num_batches_tracked) go with the next round."""
        if not self.track_running_stats:
            return
        stats = (int(entry["num_batches_tracked"]),
                 np.asarray(entry["running_mean"], dtype=np.float64),
                 np.asarray(entry["running_var"], dtype=np.float64))
        self._sn_stats = stats
        self._sn_behind = False
        self._sn_frozen_known = bool(entry.get("frozen", False))
        pristine = spec is not None and stats[0] == 0 and (
            list(stats[1]) == list(spec["initial_running_mean"]) and
            list(stats[2]) == list(spec["initial_running_var"]))
        if not pristine:
            self._write_buffers(stats)

    def _write_buffers(self, stats):
        nbt, mean, var = stats
        with torch.no_grad():
            self.running_mean.copy_(torch.from_numpy(mean))
            self.running_var.copy_(torch.from_numpy(var))
            self.num_batches_tracked.fill_(nbt)

    def _changed_buffers(self):
        """The buffers as an import (num_batches_tracked, mean, var in
        float64) when they differ from the aggregator's statistics as last
        known (cast to their dtype), else None."""
        if self.running_mean is None or self.running_var is None or \
                self.num_batches_tracked is None:
            raise RuntimeError(
                "this SyncBatchNorm's running statistics buffers were removed "
                "after it was attached (track_running_stats=True); give them "
                "back or attach a model built with track_running_stats=False")
        nbt, mean, var = self._sn_stats
        got = [t.detach().cpu() for t in (self.running_mean, self.running_var)]
        same = int(self.num_batches_tracked) == nbt and all(
            t.shape == w.shape and torch.equal(
                t, torch.from_numpy(w).to(t.dtype))
            for t, w in zip(got, (mean, var)))
        if same:
            return None
        return self._buffers_as_import(got)

    def _buffers_as_import(self, got=None):
        """The buffers as (num_batches_tracked, mean, var) in float64
        (`got`: running_mean and running_var already on the CPU)."""
        if got is None:
            got = [t.detach().cpu()
                   for t in (self.running_mean, self.running_var)]
        return (int(self.num_batches_tracked),
                got[0].double().numpy().ravel(),
                got[1].double().numpy().ravel())

    def _round_momentum(self):
        """(mode, momentum) of this round when it is not the job's layer
        spec's, else None: torch and apex read momentum at every forward."""
        mode = self.momentum_mode
        value = 0.0 if self.momentum is None else float(self.momentum)
        spec_mode, spec_value = self._sn_rule[0], self._sn_rule[1]
        if _syncnorm.same_momentum(mode, value, spec_mode, spec_value):
            return None
        return (mode, value)

    # ---- forward -----------------------------------------------------------

    def _check_input(self, input, z):
        if not isinstance(input, torch.Tensor):
            raise TypeError("SyncBatchNorm expected a torch.Tensor input, "
                            "got %s" % type(input).__name__)
        layout = "(N, ..., C) (channel_last)" if self.channel_last else \
            "(N, C, ...)"
        if not 2 <= input.dim() <= 5:
            raise ValueError("SyncBatchNorm expected 2-D to 5-D input %s, "
                             "got %d-D input of shape %s"
                             % (layout, input.dim(), tuple(input.shape)))
        if input.dtype not in DTYPE_CODES:
            raise TypeError("SyncBatchNorm expected float32, float16 or "
                            "bfloat16 input, got %s" % input.dtype)
        channels = input.shape[-1] if self.channel_last and input.dim() > 2 \
            else input.shape[1]
        # A trace's sizes are tensors: its batch_norm checks the channels.
        if self.num_features and not torch.jit.is_tracing() and \
                channels != self.num_features:
            raise ValueError(
                "SyncBatchNorm expected input with %d channels "
                "(num_features) in %s, got %d (input shape %s)"
                % (self.num_features, "the last dimension (channel_last)"
                   if self.channel_last and input.dim() > 2
                   else "dimension 1", channels, tuple(input.shape)))
        for t in (self.weight, self.running_mean):
            if (t is not None and self.num_features and
                    t.device != input.device):
                raise RuntimeError(
                    "SyncBatchNorm expected input on %s, where its "
                    "parameters are, got input on %s"
                    % (t.device, input.device))
        if z is not None and (not isinstance(z, torch.Tensor) or
                              (not torch.jit.is_tracing() and
                               z.shape != input.shape) or
                              z.dtype != input.dtype or
                              z.device != input.device):
            raise ValueError(
                "SyncBatchNorm expected z with the input's shape %s, dtype "
                "%s and device %s" % (tuple(input.shape), input.dtype,
                                      input.device))
        return channels

    def forward(self, input, z: Optional[torch.Tensor] = None):
        if not torch.jit.is_scripting():
            self._prepare(input, z)
        if self._normalizes_locally():
            return self._forward_local(input, z)
        if torch.jit.is_scripting():
            raise RuntimeError(
                "a scripted SyncBatchNorm normalizes with the running "
                "statistics only (eval, freeze, use_global_stats): training "
                "syncs through the service, which the eager module does")
        return self._forward_synced(input, z)

    def _runs_no_rounds(self) -> bool:
        """freeze or use_global_stats: the running statistics normalize,
        in training too, and no round runs."""
        return self.freeze or self.use_global_stats

    def _normalizes_locally(self) -> bool:
        """Whether this forward runs no round: it normalizes with the running
        statistics (eval, freeze, use_global_stats), or with the local
        batch's in eval without running statistics (torch's)."""
        return self._runs_no_rounds() or not self.training

    @torch.jit.unused
    def _prepare(self, input: torch.Tensor,
                 z: Optional[torch.Tensor]) -> None:
        """The eager checks of a forward: the input, the channels of an
        in_channels=0 layer, and the running statistics of a layer that
        lags (a stale-synchronous job)."""
        channels = self._check_input(input, z)
        if self.num_features == 0:
            self._materialize(int(channels), input)
        if self.track_running_stats and self._normalizes_locally():
            self._sn_catch_up()
            self._sn_push_frozen()
        if self.training and self._runs_no_rounds():
            # A training forward of a frozen layer counts as one, so that
            # its step stays the session's (Session.checkpoint) and it
            # takes the session's next step when it is unfrozen.
            self._sn_step += 1

    def _forward_local(self, input: torch.Tensor,
                       z: Optional[torch.Tensor]) -> torch.Tensor:
        """torch's batch norm on this rank alone, with torch's ops (so that
        it traces, scripts and exports, the buffers as buffers): the
        running statistics when tracked, else the local batch's. float32
        arithmetic for half types, as the kernels do."""
        use_running = self.track_running_stats
        weight, bias = self.weight, self.bias
        if self.freeze and weight is not None:  # MegEngine: frozen too
            weight = weight.detach()
        if self.freeze and bias is not None:
            bias = bias.detach()
        x = input
        if self.channel_last and x.dim() > 2:
            x = x.movedim(-1, 1)
        if x.dtype != torch.float32:
            x = x.float()
        y = F.batch_norm(
            x, _as_f32(self.running_mean) if use_running else None,
            _as_f32(self.running_var) if use_running else None,
            _as_f32(weight), _as_f32(bias), not use_running, 0.0, self.eps)
        if self.channel_last and y.dim() > 2:
            y = y.movedim(1, -1)
        if z is not None:
            y = y + (z if z.dtype == torch.float32 else z.float())
        if self.fuse_relu:
            y = F.relu(y)
        if y.dtype != input.dtype:
            y = y.to(input.dtype)
        return y

    @torch.jit.unused
    def _forward_synced(self, input: torch.Tensor,
                        z: Optional[torch.Tensor]) -> torch.Tensor:
        """A training forward through the service (SyncBatchNormFunction)."""
        if self._sn_session is None:
            raise RuntimeError(
                "this SyncBatchNorm is not attached to a syncnorm job, so it "
                "cannot train; call syncnorm.torch.attach(model) first (a "
                "model reloaded or copied is attached again; eval() needs no "
                "job)")
        if self.track_running_stats != self._sn_rule[3]:
            raise RuntimeError(
                "track_running_stats changed to %s after the layer was "
                "attached; the job keeps %s running statistics, so create "
                "the job again (another job_id) to change it"
                % (self.track_running_stats,
                   "its" if self._sn_rule[3] else "no"))
        dtype = input.dtype
        kernel = kernel_dtype(dtype, input.device)
        x = dense(input.to(kernel), self.channel_last)
        zk = None if z is None else like(z, x)
        y = SyncBatchNormFunction.apply(x, self.weight, self.bias, zk, self)
        return y.to(dtype)

    # ---- one round ---------------------------------------------------------

    def _exec(self, x):
        """(pool, stream) for the kernels on x's device."""
        session = self._sn_session
        pool = session.pool if session is not None else None
        stream = 0
        if x.is_cuda:
            stream = torch.cuda.current_stream(x.device).cuda_stream
        return pool, stream

    def _sync_forward(self, count, mean, m2, shape):
        session = self._sn_session
        step = self._sn_step
        momentum = imported = None
        if self.track_running_stats:
            momentum = self._round_momentum()
            imported = self._changed_buffers()
            if session.staleness:
                self._check_stale_update(momentum, imported)
        start = time.perf_counter()
        self.last_missing_ranks = ()
        self.last_view = ()
        try:
            (gcount, gmean, gvar, version, missing,
             view) = session.group.sync_forward(
                self._sn_layer, step, count, mean, m2, momentum, imported)
        except SingleValuePerChannelError as e:
            raise _single_value(shape, session, e.code, e.reason) from e
        self.last_forward_sync = time.perf_counter() - start
        if self._sn_layer == 0:
            session._poll_health()
        self.last_missing_ranks = missing
        self.last_view = view
        session.sync_seconds += self.last_forward_sync
        self._sn_step = step + 1
        if self.track_running_stats and view:
            # A stale answer: the aggregator applies the step's full merge
            # once every member has sent it, not this view's.
            self._sn_behind = True
        elif self.track_running_stats:
            self._mirror(gcount, gmean, gvar, momentum, imported, version)
        elif gcount == 1 and not self.biased_running_var:
            # torch refuses it with or without running statistics.
            raise _single_value(shape, session, "FAILED_PRECONDITION",
                                "SINGLE_VALUE_PER_CHANNEL")
        return step, gcount, gmean, gvar

    def _check_stale_update(self, momentum, imported):
        """A stale-synchronous job refuses a round's momentum and imported
        statistics: a clear error before the round instead."""
        name = self._sn_session.names[self._sn_layer] or "bn"
        tau = self._sn_session.staleness
        if momentum is not None:
            raise ValueError(
                "layer '%s': momentum changed to %r (mode %d) after it was "
                "attached to a stale-synchronous job (staleness %d), which "
                "applies the job's momentum to every step and takes no "
                "per-round momentum; set momentum before attach (it is part "
                "of the job's spec), or use a synchronous job (staleness 0)"
                % (name, self.momentum, momentum[0], tau))
        if imported is not None:
            raise ValueError(
                "layer '%s': its running statistics buffers were changed by "
                "hand (load_state_dict, reset_running_stats, ...) in a "
                "stale-synchronous job (staleness %d), whose rounds take no "
                "imported statistics; send them with "
                "Session.push_running_stats() before the next training step"
                % (name, tau))

    def _mirror(self, count, mean, var, momentum, imported, version):
        """The aggregator's update of this round, applied to its statistics
        as known here (or to those imported), into the buffers. A version
        that does not follow (another client changed the statistics) loads
        them from the aggregator instead."""
        mode, value, biased, track = self._sn_rule
        nbt, rmean, rvar = self._sn_stats
        rmean, rvar, nbt = _syncnorm.apply_round(
            mode, value, biased, track, count, mean, var, rmean, rvar, nbt,
            momentum, imported)
        self._sn_stats = (nbt, rmean, rvar)
        if nbt != version:
            self._sn_session._reload_layer(self)
        else:
            self._write_buffers(self._sn_stats)

    def _sync_backward(self, step, backward, sum_dy, sum_dy_xmu):
        """The backward round `backward` (0 for the first through the
        forward of `step`; retain_graph=True runs more)."""
        session = self._sn_session
        start = time.perf_counter()
        result = session.group.sync_backward(self._sn_layer, step, sum_dy,
                                             sum_dy_xmu, backward=backward)
        self.last_backward_sync = time.perf_counter() - start
        session.sync_seconds += self.last_backward_sync
        return result


def _stamp(*tensors):
    """Identity and version of each tensor: it changes with every in-place
    write (copy_, fill_, load_state_dict) and with a new tensor."""
    return tuple(None if t is None else (id(t), t._version) for t in tensors)


def _as_f32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if t is None or t.dtype == torch.float32:
        return t
    return t.float()


def _single_value(shape, session, code, reason):
    """torch's error for a batch of one value per channel in training, as a
    ValueError that is also a syncnorm ServiceError."""
    return SingleValuePerChannelError(
        "Expected more than 1 value per channel when training, got input "
        "size %s (on this rank; the global batch of its group, ranks %s, has "
        "1 value per channel)" % (shape, session.group_ranks),
        code, reason)
