"""CPU kernels (issue 8, item 3): GB/s of local moments, forward and backward
for NCHW and NHWC fp32 (//kernels:batch_norm on a 2-thread pool), against a
vectorized read loop (AVX2 where the CPU has it) and memcpy measured by the
same binary in the same run,
and against torch's CPU var_mean and batch_norm (2 threads) on the same
shape, measured right after."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def best(fn, reps):
    fn()
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def torch_times(n, c, hw, reps):
    """Best seconds of torch's ops per layout."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(2)
    out = {}
    for layout in ("NCHW", "NHWC"):
        x = torch.randn(n, c, hw, hw) * 2 + 3
        dy = torch.randn(n, c, hw, hw)
        if layout == "NHWC":
            x = x.contiguous(memory_format=torch.channels_last)
            dy = dy.contiguous(memory_format=torch.channels_last)
        w, b = torch.full((c,), 1.5), torch.full((c,), 0.25)
        rm, rv = torch.zeros(c), torch.ones(c)
        with torch.no_grad():
            _, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
                x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)[:3]
            out[layout] = {
                "var_mean": best(lambda: torch.var_mean(x, dim=(0, 2, 3), unbiased=False), reps),
                "bn_train_fwd": best(lambda: F.batch_norm(x, rm, rv, w, b, True), reps),
                "bn_eval_fwd": best(lambda: F.batch_norm(x, rm, rv, w, b, False), reps),
                "bn_bwd": best(lambda: torch.ops.aten.native_batch_norm_backward(
                    dy, x, w, rm, rv, save_mean, save_invstd, True, 1e-5,
                    [True, True, True]), reps),
            }
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--c", type=int, default=128)
    p.add_argument("--hw", type=int, default=56)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    if a.smoke:
        a.n, a.c, a.hw, a.reps = 2, 8, 8, 2
    out = common.run_group([[common.runfile("bench/bench-kernels"),
                             "--n=%d" % a.n, "--c=%d" % a.c, "--hw=%d" % a.hw,
                             "--threads=2", "--reps=%d" % a.reps]])[0]
    gbs, secs = {}, {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "KERNEL":
            gbs[(parts[1], parts[2])] = float(parts[3])
            secs[(parts[1], parts[2])] = float(parts[4])
    tt = torch_times(a.n, a.c, a.hw, a.reps)
    nbytes = 4.0 * a.n * a.c * a.hw * a.hw
    read, memcpy = gbs[("-", "read")], gbs[("-", "memcpy")]
    print("\n### CPU kernels, fp32, x = %d x %d x %d x %d (%.1f MB), 2 threads "
          "(GB/s; read loop %.2f, memcpy %.2f)\n" % (a.n, a.c, a.hw, a.hw,
                                                     nbytes / 1e6, read, memcpy))
    rows = []
    for layout in ("NCHW", "NHWC"):
        t = tt[layout]
        k = {op: gbs[(layout, op)] for op in ("moments", "forward", "backward")}
        rows.append([layout, "%.2f" % k["moments"], "%.2f" % (nbytes / t["var_mean"] / 1e9),
                     "%.2f" % k["forward"], "%.2f" % (2 * nbytes / t["bn_eval_fwd"] / 1e9),
                     "%.2f" % k["backward"], "%.2f" % (5 * nbytes / t["bn_bwd"] / 1e9)])
    common.table(["layout", "moments", "torch var_mean", "forward",
                  "torch batch_norm eval", "backward", "torch batch_norm backward"],
                 rows)
    print()
    for layout in ("NCHW", "NHWC"):
        t = tt[layout]
        common.ratio("moments_GBps[%s]" % layout, gbs[(layout, "moments")],
                     "read_loop_GBps", read, "GB/s", 0.8, higher_is_better=True)
        common.ratio("forward_GBps[%s]" % layout, gbs[(layout, "forward")],
                     "memcpy_GBps", memcpy, "GB/s", 0.7, higher_is_better=True)
        common.ratio("backward_GBps[%s]" % layout, gbs[(layout, "backward")],
                     "memcpy_GBps", memcpy, "GB/s")
        common.ratio("torch_var_mean_s/moments_s[%s]" % layout, t["var_mean"],
                     "moments_s", secs[(layout, "moments")], "s", 10.0,
                     higher_is_better=True)
        common.ratio("torch_bn_train_fwd_s/(moments+forward)_s[%s]" % layout,
                     t["bn_train_fwd"], "moments+forward_s",
                     secs[(layout, "moments")] + secs[(layout, "forward")], "s")
        common.ratio("torch_bn_eval_fwd_s/forward_s[%s]" % layout, t["bn_eval_fwd"],
                     "forward_s", secs[(layout, "forward")], "s")
        common.ratio("torch_bn_bwd_s/backward_s[%s]" % layout, t["bn_bwd"],
                     "backward_s", secs[(layout, "backward")], "s")


if __name__ == "__main__":
    main()
    common.require_ratios()
