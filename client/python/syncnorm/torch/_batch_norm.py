"""SyncBatchNorm: the module."""

import time

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .. import _syncnorm
from .._client import layer_spec, momentum_mode_code
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
      round and no update; gamma/beta still learn) and
      ``momentum_mode="megengine"`` (running = m * running + (1 - m) *
      batch, with momentum=0.9 as MegEngine's default).
    * MXNet: ``center`` / ``scale`` (beta / gamma separately),
      ``use_global_stats`` (= freeze), ``in_channels`` (= num_features;
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

    momentum=None is torch's cumulative average. process_group: None (all
    ranks of the job), an int k, or an object with size() (a torch
    ProcessGroup) of k ranks: the ranks form groups of k consecutive ranks,
    each with its own statistics.

    Input is 2-D to 5-D, float32, float16 or bfloat16, on the CPU (CUDA
    tensors need a build with the CUDA kernels). Its parameters and buffers
    and its state_dict keys are torch's BatchNorm's (weight, bias,
    running_mean, running_var, num_batches_tracked). In training the module
    must be attached to a job (:func:`attach`); eval() needs no service.
    """

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
        if momentum is None:
            mode = momentum_mode_code(momentum_mode or "cumulative")
        else:
            mode = momentum_mode_code(momentum_mode or "torch")
        if (freeze or use_global_stats) and not track_running_stats:
            raise ValueError("freeze / use_global_stats normalize with the "
                             "running statistics; they need "
                             "track_running_stats=True")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.momentum_mode = mode
        self.affine = affine
        self.track_running_stats = track_running_stats
        self.process_group = process_group
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu
        self.freeze = bool(freeze or use_global_stats)
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
        self.last_forward_sync = 0.0
        self.last_backward_sync = 0.0
        self.last_missing_ranks = ()
        self._allocate(num_features)

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

    def __getstate__(self):
        state = super().__getstate__()
        state = dict(state)
        state["_sn_session"] = None  # a connection does not pickle or copy
        return state

    def extra_repr(self):
        text = super().extra_repr()
        extras = []
        if self.channel_last:
            extras.append("channel_last=True")
        if self.fuse_relu:
            extras.append("fuse_relu=True")
        if self.freeze:
            extras.append("freeze=True")
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

    def _rule(self, spec):
        return (momentum_mode_code(spec["momentum_mode"]),
                float(spec["momentum"]), bool(spec["biased_running_var"]),
                not spec["no_running_stats"])

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
        if self.num_features and channels != self.num_features:
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
                              z.shape != input.shape or
                              z.dtype != input.dtype or
                              z.device != input.device):
            raise ValueError(
                "SyncBatchNorm expected z with the input's shape %s, dtype "
                "%s and device %s" % (tuple(input.shape), input.dtype,
                                      input.device))
        kernel_dtype(input.dtype, input.device)
        return channels

    def forward(self, input, z=None):
        channels = self._check_input(input, z)
        if self.num_features == 0:
            self._materialize(int(channels), input)
        use_running = self.freeze or (not self.training and
                                      self.track_running_stats)
        sync = self.training and not use_running
        if sync and self._sn_session is None:
            raise RuntimeError(
                "this SyncBatchNorm is not attached to a syncnorm job, so it "
                "cannot train; call syncnorm.torch.attach(model, client, "
                "job_id, rank, world_size) first (eval() needs no job)")
        dtype = input.dtype
        kernel = kernel_dtype(dtype, input.device)
        x = dense(input.to(kernel), self.channel_last)
        zk = None if z is None else like(z, x)
        y = SyncBatchNormFunction.apply(x, self.weight, self.bias, zk, self,
                                        sync, use_running)
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

    def _sync_forward(self, count, mean, m2):
        session = self._sn_session
        step = self._sn_step
        start = time.perf_counter()
        self.last_missing_ranks = ()
        gcount, gmean, gvar, _, missing = session.group.sync_forward(
            self._sn_layer, step, count, mean, m2)
        self.last_forward_sync = time.perf_counter() - start
        self.last_missing_ranks = missing
        session.sync_seconds += self.last_forward_sync
        self._sn_step = step + 1
        if self.track_running_stats and gcount > 0:
            self._mirror(gcount, gmean, gvar)
        return step, gcount, gmean, gvar

    def _mirror(self, count, mean, var):
        """The aggregator's running-statistics update, applied locally."""
        mode, momentum, biased, track = self._sn_rule
        rmean, rvar, nbt = _syncnorm.apply_round(
            mode, momentum, biased, track, count, mean, var,
            host_f64(self.running_mean), host_f64(self.running_var),
            int(self.num_batches_tracked))
        with torch.no_grad():
            self.running_mean.copy_(torch.from_numpy(rmean))
            self.running_var.copy_(torch.from_numpy(rvar))
            self.num_batches_tracked.fill_(nbt)

    def _sync_backward(self, step, sum_dy, sum_dy_xmu):
        session = self._sn_session
        start = time.perf_counter()
        result = session.group.sync_backward(self._sn_layer, step, sum_dy,
                                             sum_dy_xmu)
        self.last_backward_sync = time.perf_counter() - start
        session.sync_seconds += self.last_backward_sync
        return result
