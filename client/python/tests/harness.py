"""Test harness: the real aggregator on loopback, worker processes, the
cases' data, and the error metric. Used by the tests and by worker.py."""

import os
import socket
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))


def aggregator_binary():
    """The aggregator: $SYNCNORM_AGGREGATOR, the test's runfiles, or the
    checkout's bazel-bin."""
    candidates = [os.environ.get("SYNCNORM_AGGREGATOR", "")]
    for root in (os.environ.get("TEST_SRCDIR"),
                 os.environ.get("RUNFILES_DIR")):
        if root:
            candidates.append(os.path.join(root, "syncnorm", "server",
                                           "syncnorm-aggregator"))
    repo = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    candidates.append(os.path.join(repo, "bazel-bin", "server",
                                   "syncnorm-aggregator"))
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise RuntimeError("the aggregator binary was not found; build "
                       "//server:syncnorm-aggregator or set "
                       "SYNCNORM_AGGREGATOR (looked at %s)" % candidates)


def relay_binary():
    """The relay (docs/relay.md): $SYNCNORM_RELAY, the test's runfiles, or
    the checkout's bazel-bin."""
    candidates = [os.environ.get("SYNCNORM_RELAY", "")]
    for root in (os.environ.get("TEST_SRCDIR"),
                 os.environ.get("RUNFILES_DIR")):
        if root:
            candidates.append(os.path.join(root, "syncnorm", "relay",
                                           "syncnorm_relay"))
    repo = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    candidates.append(os.path.join(repo, "bazel-bin", "relay",
                                   "syncnorm_relay"))
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise RuntimeError("the relay binary was not found; build "
                       "//relay:syncnorm_relay or set SYNCNORM_RELAY "
                       "(looked at %s)" % candidates)


class Aggregator:
    """The aggregator binary on a free loopback port; a context manager."""

    def __init__(self, flags=()):
        self.dir = tempfile.mkdtemp(prefix="syncnorm-py-",
                                    dir=os.environ.get("TEST_TMPDIR"))
        port_file = os.path.join(self.dir, "port")
        self.log_path = os.path.join(self.dir, "aggregator.log")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [aggregator_binary(), "--listen=127.0.0.1:0",
             "--port_file=" + port_file,
             "--data_dir=" + os.path.join(self.dir, "data")] + list(flags),
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.address = "127.0.0.1:" + text
                    return
            if self.process.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("the aggregator did not start: " +
                                   open(self.log_path).read())
            time.sleep(0.02)

    def stop(self):
        _stop(self.process)
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Relay:
    """The relay binary on a free loopback port, in front of `upstream`
    (the aggregator's address); a context manager."""

    def __init__(self, upstream, flags=()):
        self.dir = tempfile.mkdtemp(prefix="syncnorm-relay-",
                                    dir=os.environ.get("TEST_TMPDIR"))
        port_file = os.path.join(self.dir, "port")
        self.log_path = os.path.join(self.dir, "relay.log")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [relay_binary(), "--listen=127.0.0.1:0", "--upstream=" + upstream,
             "--port_file=" + port_file] + list(flags),
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.address = "127.0.0.1:" + text
                    return
            if self.process.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("the relay did not start: " +
                                   open(self.log_path).read())
            time.sleep(0.02)

    def stop(self):
        _stop(self.process)
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _stop(process):
    """Stops a child (SIGTERM, then SIGKILL after 10 s) and reaps it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def child_env():
    """The environment of worker processes: this process's import path
    (where the built syncnorm package is) plus this folder."""
    import syncnorm
    package_root = os.path.dirname(os.path.dirname(
        os.path.abspath(syncnorm.__file__)))
    env = dict(os.environ)
    paths = [package_root, HERE] + [p for p in sys.path if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port():
    """A TCP port of 127.0.0.1 that no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_gloo_workers(script, world_size, args, env=None):
    """Starts `world_size` processes of `script` (a file of this folder)
    with `args`, as torchrun would for torch.distributed's env:// (MASTER_*,
    RANK, LOCAL_RANK, WORLD_SIZE) plus `env`; their processes, for
    wait_workers."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        child = child_env()
        child.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                      "RANK": str(rank), "LOCAL_RANK": str(rank),
                      "WORLD_SIZE": str(world_size)})
        child.update(env or {})
        procs.append(subprocess.Popen(
            [PYTHON, os.path.join(HERE, script)] + list(args), env=child,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def wait_workers(procs, timeout):
    """Waits for worker processes (stdout piped, stderr into it), killing
    any still running after `timeout` seconds each; one "--- rank r (exit
    code) ---" entry with the tail of its output per worker that failed."""
    failures = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        if p.returncode != 0:
            failures.append("--- rank %d (exit %s) ---\n%s" % (
                rank, p.returncode, out.decode(errors="replace")[-6000:]))
    return failures


def rel_error(actual, expected, floor=0.0):
    """max |actual - expected| / max(max |expected|, floor) in float64 (the
    absolute error when both are zero)."""
    import torch
    a = torch.as_tensor(actual).double()
    e = torch.as_tensor(expected).double()
    if a.shape != e.shape:
        raise AssertionError("shape %s != %s" % (tuple(a.shape),
                                                 tuple(e.shape)))
    if e.numel() == 0:
        return 0.0
    scale = max(e.abs().max().item(), floor)
    if scale == 0:
        scale = 1.0
    return (a - e).abs().max().item() / scale
