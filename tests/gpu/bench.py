"""Times syncnorm's CUDA kernels with CUDA events on tensors of at least 4x
the GPU's L2 cache, against torch's CUDA batch_norm on the same tensors and
a device-to-device copy of the same bytes, and checks every output against
torch in float64. Prints a table last.

Run by tests/gpu/device_check.sh:  python3 bench.py --lib libsyncnorm_bench.so
Needs PyTorch with CUDA; no Bazel, no network. --self-test runs the table,
the sizing and the float64 checks on the CPU (no GPU needed).

Columns (times per call, from CUDA events around 20 calls after 3 warm-ups;
the per-channel host arrays are allocated before, so nothing per channel
runs in Python inside the timed loop):
  moments   LocalMoments (waits for its result: the round needs it on the host)
  train fwd LocalMoments + Forward, vs torch's training F.batch_norm
  eval fwd  Forward alone, vs torch's eval F.batch_norm
  bwd       BackwardReduce + BackwardElementwise, vs autograd's grad of x
  copy      x.copy_ into y: the bytes every kernel must move at least
GB/s = bytes read and written / time; "vs copy" = copy time / our time for
the same bytes moved (1.0 = as fast as a copy).
"""
import argparse
import ctypes
import sys

import torch
import torch.nn.functional as F

DTYPES = {"float32": (torch.float32, 0), "float16": (torch.float16, 1),
          "bfloat16": (torch.bfloat16, 2)}
EPS = 1e-5
ITERS = 20
# Relative to max |ref| (float64 torch): our outputs round once to the type.
TOLERANCE = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def load(path):
    lib = ctypes.CDLL(path)
    vp, i64, dp, fp, i = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_int)
    lib.sn_l2_bytes.restype = i64
    lib.sn_moments.argtypes = [vp, i, vp, i64, i64, i64, dp, dp]
    lib.sn_train_forward.argtypes = [vp, i, vp, vp, i64, i64, i64, fp, fp,
                                     ctypes.c_double, dp, dp]
    lib.sn_forward.argtypes = [vp, i, vp, vp, i64, i64, i64, dp, dp, fp, fp]
    lib.sn_backward.argtypes = [vp, i, vp, vp, vp, i64, i64, i64, dp, dp, fp,
                                dp, dp]
    for f in (lib.sn_moments, lib.sn_train_forward, lib.sn_forward,
              lib.sn_backward):
        f.restype = i
    return lib


def cases(l2_bytes):
    """(name, shape NCHW, channels_last, dtype): the main shape per dtype and
    layout, and the shapes the coalescing fixes were for; N makes every
    tensor at least 4x L2 in its dtype."""
    out = []

    def sized(c, h, w, dtype):
        item = c * h * w * torch.tensor([], dtype=dtype).element_size()
        return max(1, -(-4 * l2_bytes // item))

    for name in DTYPES:
        dtype = DTYPES[name][0]
        for last in (False, True):
            out.append(("resnet", (sized(256, 56, 56, dtype), 256, 56, 56),
                        last, name))
    h16 = DTYPES["float16"][0]
    out.append(("C=3 channels-last", (sized(3, 224, 224, h16), 3, 224, 224),
                True, "float16"))
    out.append(("inner 16 < 32", (sized(512, 4, 4, h16), 512, 4, 4), False,
                "float16"))
    return out


def geometry(shape, last):
    n, c = shape[0], shape[1]
    spatial = 1
    for s in shape[2:]:
        spatial *= s
    return (n * spatial, c, 1) if last else (n, c, spatial)


def rel_err(got, ref):
    ref = ref.double()
    return ((got.double() - ref).abs().max() /
            ref.abs().max().clamp_min(1e-300)).item()


class Timer:
    """Mean time per call of fn with CUDA events on the current stream."""

    def __init__(self, iters):
        self.iters = iters

    def __call__(self, fn):
        for _ in range(3):
            fn()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / self.iters * 1e-3  # seconds


def run_case(lib, case, timer, device):
    name, shape, last, dtype_name = case
    dtype, code = DTYPES[dtype_name]
    c = shape[1]
    outer, _, inner = geometry(shape, last)
    fmt = torch.channels_last if last else torch.contiguous_format
    gen = torch.Generator(device=device).manual_seed(7)
    x = (torch.randn(shape, device=device, generator=gen) * 2 + 0.5).to(
        dtype).contiguous(memory_format=fmt)
    dy = torch.randn(shape, device=device, generator=gen).to(dtype).contiguous(
        memory_format=fmt)
    y = torch.empty_like(x)
    gi = torch.empty_like(x)
    w = torch.rand(c, device=device) + 0.5
    b = torch.rand(c, device=device) - 0.5
    dbl, flt = ctypes.c_double * c, ctypes.c_float * c
    mean, invstd, s1, s2 = dbl(), dbl(), dbl(), dbl()
    wh, bh = flt(*w.tolist()), flt(*b.tolist())
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    xp, yp, dyp, gip = x.data_ptr(), y.data_ptr(), dy.data_ptr(), gi.data_ptr()

    def check(rc, what):
        if rc != 0:
            raise RuntimeError("%s returned %d" % (what, rc))

    def moments():
        check(lib.sn_moments(stream, code, xp, outer, c, inner, mean, s1),
              "sn_moments")

    def train_forward():
        check(lib.sn_train_forward(stream, code, xp, yp, outer, c, inner, wh,
                                   bh, EPS, mean, invstd), "sn_train_forward")

    def eval_forward():
        check(lib.sn_forward(stream, code, xp, yp, outer, c, inner, mean,
                             invstd, wh, bh), "sn_forward")

    def backward():
        check(lib.sn_backward(stream, code, dyp, xp, gip, outer, c, inner,
                              mean, invstd, wh, s1, s2), "sn_backward")

    running_mean = torch.zeros(c, device=device)
    running_var = torch.ones(c, device=device)

    def torch_train():
        F.batch_norm(x, None, None, weight=w, bias=b, training=True, eps=EPS)

    def torch_eval():
        F.batch_norm(x, running_mean, running_var, weight=w, bias=b,
                     training=False, eps=EPS)

    xr = x.detach().requires_grad_(True)
    yt = F.batch_norm(xr, None, None, weight=w, bias=b, training=True, eps=EPS)

    def torch_backward():
        torch.autograd.grad(yt, xr, dy, retain_graph=True)

    def copy():
        y.copy_(x)

    # Correctness against torch in float64 on the same input.
    train_forward()
    backward()
    torch.cuda.synchronize()
    x64 = x.detach().double().requires_grad_(True)
    y64 = F.batch_norm(x64, None, None, weight=w.double(), bias=b.double(),
                       training=True, eps=EPS)
    (g64,) = torch.autograd.grad(y64, x64, dy.double())
    err_y, err_g = rel_err(y, y64.detach()), rel_err(gi, g64)
    del x64, y64, g64
    t = {k: timer(f) for k, f in [
        ("moments", moments), ("train", train_forward), ("eval", eval_forward),
        ("backward", backward), ("torch_train", torch_train),
        ("torch_eval", torch_eval), ("torch_backward", torch_backward),
        ("copy", copy)]}
    nbytes = x.numel() * x.element_size()
    return {"case": "%s %s %s %s" % (name, "x".join(map(str, shape)),
                                     "NHWC" if last else "NCHW", dtype_name),
            "mb": nbytes / 2**20, "t": t, "bytes": nbytes,
            "err_y": err_y, "err_g": err_g,
            "ok": err_y <= TOLERANCE[dtype] and err_g <= 4 * TOLERANCE[dtype]}


def table(rows, title):
    lines = [title,
             "%-42s %7s | %8s %6s | %8s %8s %6s | %8s %8s | %8s %8s %6s | %8s "
             "%6s | %7s %7s" % (
                 "case", "MB", "moments", "GB/s", "trainfwd", "torch", "vscopy",
                 "evalfwd", "torch", "bwd", "torch", "vscopy", "copy",
                 "GB/s", "err y", "err dx")]
    lines.append("-" * len(lines[1]))
    for r in rows:
        t, nb = r["t"], r["bytes"]
        us = lambda s: s * 1e6
        gbs = lambda moved, s: moved * nb / s / 1e9
        # Bytes moved: moments reads x; train forward reads x twice (moments,
        # forward) and writes y; backward reads dy and x twice and writes dx;
        # a copy reads and writes once.
        lines.append(
            "%-42s %7.0f | %8.1f %6.0f | %8.1f %8.1f %6.2f | %8.1f %8.1f | "
            "%8.1f %8.1f %6.2f | %8.1f %6.0f | %7.1e %7.1e%s" % (
                r["case"], r["mb"], us(t["moments"]), gbs(1, t["moments"]),
                us(t["train"]), us(t["torch_train"]),
                (t["copy"] * 1.5) / t["train"], us(t["eval"]),
                us(t["torch_eval"]), us(t["backward"]),
                us(t["torch_backward"]), (t["copy"] * 2.5) / t["backward"],
                us(t["copy"]), gbs(2, t["copy"]), r["err_y"], r["err_g"],
                "" if r["ok"] else "  <- beyond tolerance"))
    return "\n".join(lines)


def self_test():
    """The sizing, the float64 comparison and the table on the CPU."""
    l2 = 50 * 2**20
    for name, shape, last, dtype_name in cases(l2):
        dtype = DTYPES[dtype_name][0]
        item = 1
        for s in shape[1:]:
            item *= s
        nbytes = shape[0] * item * torch.tensor([], dtype=dtype).element_size()
        assert nbytes >= 4 * l2, (name, shape, nbytes)
        outer, c, inner = geometry(shape, last)
        assert outer * c * inner == shape[0] * item
    x = torch.randn(8, 3, 5, 5, dtype=torch.float64)
    ref = F.batch_norm(x, None, None, training=True, eps=EPS)
    bad = ref.float().clone()
    bad[0, 0, 0, 0] += 1.0
    assert rel_err(ref.float(), ref) < TOLERANCE[torch.float32]
    assert rel_err(bad, ref) > TOLERANCE[torch.float32]
    fake = {k: 1e-4 for k in ("moments", "train", "eval", "backward",
                              "torch_train", "torch_eval", "torch_backward",
                              "copy")}
    text = table([{"case": "self-test", "mb": 1.0, "t": fake,
                   "bytes": 2**20, "err_y": 1e-7, "err_g": 1e-7, "ok": True}],
                 "self-test table")
    assert "vscopy" in text and "self-test" in text
    print(text)
    print("PASS bench.py self-test: sizing to 4x L2, float64 checks, table")
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib")
    parser.add_argument("--iters", type=int, default=ITERS)
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not torch.cuda.is_available():
        print("no CUDA device: PyTorch sees none")
        return 2
    lib = load(args.lib)
    l2 = lib.sn_l2_bytes()
    if l2 <= 0:
        print("FAIL cannot read the GPU's L2 size")
        return 1
    timer = Timer(args.iters)
    rows = []
    for case in cases(l2):
        rows.append(run_case(lib, case, timer, torch.device("cuda")))
        torch.cuda.empty_cache()
    print(table(rows, "syncnorm CUDA kernels vs torch %s (%s, L2 %d MB, %d "
                      "calls per timing)" % (
                          torch.__version__, torch.cuda.get_device_name(0),
                          l2 >> 20, args.iters)))
    bad = [r["case"] for r in rows if not r["ok"]]
    if bad:
        print("FAIL outputs differ from torch's float64 beyond tolerance: " +
              ", ".join(bad))
        return 1
    print("PASS benchmark: every output within tolerance of torch in float64")
    return 0


if __name__ == "__main__":
    sys.exit(main())
