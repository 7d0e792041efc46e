"""Shared helpers of the benchmark drivers: locating the built binaries,
starting servers and workers, percentiles, and RATIO / table output."""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

# Debian's interpreter, with python3-torch; the python3 on PATH may differ.
PYTHON = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def runfile(path):
    """An executable built by Bazel, from the runfiles tree or bazel-bin."""
    for base in (ROOT, os.path.join(ROOT, "bazel-bin")):
        candidate = os.path.join(base, path)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    sys.exit("bench: %s not found; build it with bazel build //bench/..." % path)


def scratch_dir(prefix):
    base = os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=prefix + "-", dir=base)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU time of process `pid` so far (its threads'; not
    its children's)."""
    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A server binary on a free loopback port (it writes --port_file)."""

    def __init__(self, binary, tmp, name, extra=(), env=None, data_dir=None):
        """`data_dir`: give the binary a fresh --data_dir (None: every
        binary but bench-server, which keeps nothing)."""
        port_file = os.path.join(tmp, name + ".port")
        self.log = os.path.join(tmp, name + ".log")
        if data_dir is None:
            data_dir = os.path.basename(binary) != "bench-server"
        if data_dir:
            # An aggregator (this build's, or a baseline binary of any name)
            # gets a fresh data dir per run: the default (./syncnorm-data)
            # would carry one run's jobs and steps into the next, whose
            # rounds would then be refused as superseded.
            extra = ["--data_dir=" + os.path.join(tmp, name + "-data")] + list(extra)
        self.proc = subprocess.Popen(
            [runfile(binary), "--listen=127.0.0.1:0", "--port_file=" + port_file]
            + list(extra), stderr=open(self.log, "w"),
            env=None if env is None else dict(os.environ, **env))
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                sys.exit("bench: %s did not start; see %s" % (binary, self.log))
            time.sleep(0.02)
        self.address = "127.0.0.1:%s" % open(port_file).read().strip()

    def cpu_seconds(self):
        """User + system CPU time of the process so far."""
        return cpu_seconds(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_group(argvs, timeout=600):
    """Runs the commands concurrently; returns their stdouts. Fails the
    benchmark (with the stderr) if one fails."""
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for a in argvs]
    outs = []
    for a, p in zip(argvs, procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit("bench: timed out: %s" % " ".join(a))
        if p.returncode != 0:
            for q in procs:
                q.kill()
            sys.exit("bench: %s failed (%d):\n%s" % (" ".join(a), p.returncode, err[-3000:]))
        outs.append(out)
    return outs


def run_micro(binary):
    """Runs a same-process micro-benchmark (`binary`, a runfile path such as
    bench/bench-crc32c) with this driver's --reps (2 under --smoke); returns
    its stdout and the reps."""
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--reps", type=int, default=15)
    a = p.parse_args()
    reps = 2 if a.smoke else a.reps
    out = subprocess.run([runfile(binary), "--reps=%d" % reps], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return out, reps


def parse_lines(outs, tag):
    """{key: [values...]} over every output's `TAG key v v v` lines (key is
    '' for `TAG v v v` lines)."""
    merged = {}
    for out in outs:
        for line in out.splitlines():
            parts = line.split()
            if not parts or parts[0] != tag:
                continue
            if tag == "STEP":
                key, values = "", parts[1:]
            else:
                key, values = parts[1], parts[2:]
            merged.setdefault(key, []).extend(float(v) for v in values)
    return merged


def percentile(values, q):
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


_ratios_printed = 0


def require_ratios():
    """Fails (for the smoke tests) unless some RATIO line was printed."""
    if _ratios_printed == 0:
        sys.exit("bench: no RATIO line was printed")


def ratio(name, value, ref_name, ref, unit, target=None, higher_is_better=False):
    """Prints and returns one RATIO line: value / ref, with the verdict of
    `target` (a bound on the ratio) when given."""
    r = value / ref if ref else float("inf")
    verdict = ""
    if target is not None:
        met = r >= target if higher_is_better else r <= target
        verdict = "  target %s%gx: %s" % (">=" if higher_is_better else "<=", target,
                                          "MET" if met else "NOT MET")
    line = "RATIO %s = %.4g %s vs %s = %.4g %s -> %.3fx%s" % (
        name, value, unit, ref_name, ref, unit, r, verdict)
    print(line, flush=True)
    global _ratios_printed
    _ratios_printed += 1
    return r


def table(header, rows):
    """Prints a markdown table."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    sys.stdout.flush()
