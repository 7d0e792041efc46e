"""Times syncnorm's CUDA kernels against torch.nn.functional.batch_norm on the
same CUDA tensors, and against a device-to-device copy; prints a table.

Run by tests/gpu/device_check.sh:  python3 bench.py --lib libsyncnorm_bench.so
Needs PyTorch with CUDA; no Bazel, no network.
"""
import argparse
import ctypes
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = [("float32", torch.float32, 0), ("float16", torch.float16, 1),
          ("bfloat16", torch.bfloat16, 2)]


def load(path):
    lib = ctypes.CDLL(path)
    vp, i64, dp, fp = ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p
    lib.sn_moments.argtypes = [vp, ctypes.c_int, vp, i64, i64, i64, dp, dp]
    lib.sn_forward.argtypes = [vp, ctypes.c_int, vp, vp, i64, i64, i64, dp, dp, fp, fp]
    lib.sn_backward.argtypes = [vp, ctypes.c_int, vp, vp, vp, i64, i64, i64, dp, dp,
                                fp, dp, dp, i64]
    for f in (lib.sn_moments, lib.sn_forward, lib.sn_backward):
        f.restype = ctypes.c_int
    return lib


def timeit(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def check(rc, what):
    if rc != 0:
        raise SystemExit("FAIL %s returned %d" % (what, rc))


def bench_case(lib, name, dtype, code, shape, last, iters):
    n, c = shape[0], shape[1]
    spatial = 1
    for s in shape[2:]:
        spatial *= s
    x = torch.randn(shape, device="cuda", dtype=torch.float32).mul_(2).add_(0.5).to(dtype)
    if last:
        x = x.contiguous(memory_format=torch.channels_last)
        outer, inner = n * spatial, 1
    else:
        outer, inner = n, spatial
    dy = torch.randn_like(x)
    y = torch.empty_like(x)
    gi = torch.empty_like(x)
    w = torch.rand(c, device="cuda") + 0.5
    b = torch.rand(c, device="cuda") - 0.5
    dbl = ctypes.c_double * c
    flt = ctypes.c_float * c
    mean, m2, invstd, s1, s2 = dbl(), dbl(), dbl(), dbl(), dbl()
    wh, bh = flt(*w.tolist()), flt(*b.tolist())
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    count = n * spatial
    eps = 1e-5

    def moments():
        check(lib.sn_moments(stream, code, x.data_ptr(), outer, c, inner, mean, m2),
              "sn_moments")

    def forward():
        moments()
        for k in range(c):
            invstd[k] = 1.0 / ((m2[k] / count + eps) ** 0.5)
        check(lib.sn_forward(stream, code, x.data_ptr(), y.data_ptr(), outer, c, inner,
                             mean, invstd, wh, bh), "sn_forward")

    def backward():
        check(lib.sn_backward(stream, code, dy.data_ptr(), x.data_ptr(), gi.data_ptr(),
                              outer, c, inner, mean, invstd, wh, s1, s2, count),
              "sn_backward")

    xr = x.detach().requires_grad_(True)
    yt = F.batch_norm(xr, None, None, weight=w, bias=b, training=True, eps=eps)

    def torch_forward():
        F.batch_norm(x, None, None, weight=w, bias=b, training=True, eps=eps)

    def torch_backward():
        torch.autograd.grad(yt, xr, dy, retain_graph=True)

    def copy():
        y.copy_(x)

    # Correctness against torch on the same tensors.
    forward()
    backward()
    torch.cuda.synchronize()
    (gt,) = torch.autograd.grad(yt, xr, dy, retain_graph=True)
    err_y = ((y.float() - yt.detach().float()).abs().max() /
             yt.detach().float().abs().max()).item()
    err_g = ((gi.float() - gt.float()).abs().max() / gt.float().abs().max()).item()

    nbytes = x.numel() * x.element_size()
    t = {k: timeit(f, iters) for k, f in [
        ("moments", moments), ("forward", forward), ("backward", backward),
        ("torch_forward", torch_forward), ("torch_backward", torch_backward),
        ("copy", copy)]}
    gbs = lambda moved, sec: moved * nbytes / sec / 1e9
    return {
        "case": "%s %s %s" % (name, "x".join(map(str, shape)), "last" if last else "first"),
        "moments_us": t["moments"] * 1e6, "moments_gbs": gbs(1, t["moments"]),
        "fwd_us": t["forward"] * 1e6, "fwd_gbs": gbs(3, t["forward"]),
        "tfwd_us": t["torch_forward"] * 1e6,
        "bwd_us": t["backward"] * 1e6, "bwd_gbs": gbs(5, t["backward"]),
        "tbwd_us": t["torch_backward"] * 1e6,
        "copy_gbs": gbs(2, t["copy"]),
        "err_y": err_y, "err_g": err_g,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", required=True)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--shape", default="32,256,56,56")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: PyTorch sees no CUDA device")
        return 2
    lib = load(args.lib)
    shape = tuple(int(s) for s in args.shape.split(","))
    rows, bad = [], []
    for name, dtype, code in DTYPES:
        for last in (False, True):
            r = bench_case(lib, name, dtype, code, shape, last, args.iters)
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            if not (r["err_y"] <= tol and r["err_g"] <= 10 * tol):
                bad.append(r["case"])
            rows.append(r)
    print()
    print("syncnorm CUDA kernels vs torch.nn.functional.batch_norm (%s, %d iters)" %
          (torch.cuda.get_device_name(0), args.iters))
    print("moments: LocalMoments; fwd: LocalMoments + Forward (torch: F.batch_norm "
          "training forward); bwd: BackwardReduce + BackwardElementwise (torch: "
          "autograd grad of x); GB/s = tensor bytes moved / time; ratio = torch / ours")
    head = ("%-34s %9s %7s | %9s %7s %9s %6s | %9s %7s %9s %6s | %8s | %8s %8s" %
            ("case", "mom us", "GB/s", "fwd us", "GB/s", "torch us", "ratio",
             "bwd us", "GB/s", "torch us", "ratio", "copyGB/s", "err y", "err dx"))
    print(head)
    print("-" * len(head))
    for r in rows:
        print("%-34s %9.1f %7.0f | %9.1f %7.0f %9.1f %6.2f | %9.1f %7.0f %9.1f %6.2f | %8.0f | %8.1e %8.1e" % (
            r["case"], r["moments_us"], r["moments_gbs"], r["fwd_us"], r["fwd_gbs"],
            r["tfwd_us"], r["tfwd_us"] / r["fwd_us"], r["bwd_us"], r["bwd_gbs"],
            r["tbwd_us"], r["tbwd_us"] / r["bwd_us"], r["copy_gbs"], r["err_y"],
            r["err_g"]))
    if bad:
        print("FAIL outputs differ from torch beyond tolerance: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
