"""Torch tensors as the extension takes them: dtype codes, the kernels'
dtype, descriptors, layouts and per-channel host arrays."""

import contextlib

import torch

from .. import _syncnorm

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_SUPPORTED = {}


def device_code(device):
    return 1 if device.type == "cuda" else 0


def kernel_dtype(dtype, device):
    """The dtype the kernels run `dtype` input in, on `device`.

    The one place that decides the float16 / bfloat16 fallback: if this
    build's kernels take the dtype there (probed once), the input goes as
    is; half types on a CPU build without half kernels go as float32 and the
    result is cast back. Statistics are float64 either way.
    """
    key = (dtype, device.type)
    if key not in _SUPPORTED:
        code, dev = DTYPE_CODES[dtype], device_code(device)
        if _syncnorm.supports(code, dev):
            _SUPPORTED[key] = dtype
        elif dev == 0 and _syncnorm.supports(0, 0):
            _SUPPORTED[key] = torch.float32
        else:
            _SUPPORTED[key] = None
    kernel = _SUPPORTED[key]
    if kernel is None:
        raise RuntimeError(
            "syncnorm's kernels in this build do not take %s tensors on %s "
            "(built without CUDA, or no usable GPU); expected a CPU tensor"
            % (dtype, device))
    return kernel


def desc(t):
    """A tensor as the extension takes it."""
    if t is None:
        return None
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()),
            DTYPE_CODES[t.dtype], device_code(t.device))


def on_device(x):
    """Makes x's GPU the current CUDA device (the kernels run there)."""
    if x.is_cuda:
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def host_f32(t):
    return None if t is None else t.detach().to(torch.float32).cpu().numpy()


def host_f64(t):
    return t.detach().to(torch.float64).cpu().numpy()


def dense(t, channel_last):
    """t, or a copy, laid out the way the kernels read: contiguous, or (for
    (N, C, ...) input) torch's channels_last memory format."""
    if t.is_contiguous():
        return t
    if not channel_last and t.dim() == 4 and t.is_contiguous(
            memory_format=torch.channels_last):
        return t
    if not channel_last and t.dim() == 5 and t.is_contiguous(
            memory_format=torch.channels_last_3d):
        return t
    return t.contiguous()


def like(t, x):
    """t with the dtype and the memory layout of x."""
    t = t.to(x.dtype)
    if t.stride() == x.stride() or x.numel() == 0:
        return t
    return torch.empty_like(x).copy_(t)


def initial(value, channels, what):
    """C initial values from a number, "zeros"/"ones", a callable (a
    torch.nn.init function applied to a fresh tensor) or C values."""
    t = torch.empty(channels, dtype=torch.float32)
    if callable(value):
        with torch.no_grad():
            value(t)
        return t
    if isinstance(value, str):
        if value not in ("zeros", "ones"):
            raise ValueError("expected %s 'zeros', 'ones', a number, a "
                             "callable or %d values, got %r"
                             % (what, channels, value))
        return t.fill_(0.0 if value == "zeros" else 1.0)
    if isinstance(value, (int, float)):
        return t.fill_(float(value))
    values = torch.as_tensor(value, dtype=torch.float32).flatten()
    if values.numel() != channels:
        raise ValueError("expected %s of %d values (one per channel), got %d"
                         % (what, channels, values.numel()))
    return values.clone()
