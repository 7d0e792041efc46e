"""syncnorm.torch.SyncBatchNorm on W worker processes against torch's
BatchNorm on the concatenated batch.

Every case (cases.CASES) runs on W = 3 worker processes with uneven shards
against one real aggregator; this process runs the same model with
torch.nn.BatchNorm1d/2d/3d in float64 on the whole batch. Outputs, input
(and residual) gradients, weight and bias gradients averaged over ranks as
DDP averages them, each rank's running statistics, the aggregator's running
statistics and eval outputs must agree: relative error (max |a - b| /
max |b|) at most 1e-5 for float32, 5e-3 for float16, 3e-2 for bfloat16.
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

import torch

import cases
import harness

WORLD_SIZE = 3


def compare(case, ranks, ref):
    """The worst relative error per quantity."""
    errors = {}

    def note(what, actual, expected, floor=0.0):
        errors[what] = max(errors.get(what, 0.0),
                           harness.rel_error(actual, expected, floor))

    w = len(case["shards"])
    offs = cases.offsets(case)
    for s, expected in enumerate(ref["steps"]):
        for r in range(w):
            lo, hi = offs[r], offs[r] + case["shards"][r]
            got = ranks[r]["steps"][s]
            note("output", got["y"], expected["y"][lo:hi])
            note("grad_input", got["dx"], expected["dx"][lo:hi])
            if expected["dz"] is not None:
                note("grad_z", got["dz"], expected["dz"][lo:hi])
        names = set(expected["grads"])
        # A gradient that is zero in exact arithmetic (the bias of a layer
        # right before a BN) is rounding noise on both sides: it is checked
        # against the step's largest gradient instead.
        largest = max([g.abs().max().item()
                       for g in expected["grads"].values()] + [0.0])
        for r in range(w):
            if set(ranks[r]["steps"][s]["grads"]) != names:
                raise AssertionError(
                    "rank %d has parameters %s, torch %s" % (
                        r, sorted(ranks[r]["steps"][s]["grads"]),
                        sorted(names)))
        for name in names:
            # DDP: every rank's gradient, averaged over the world size.
            ddp = sum(ranks[r]["steps"][s]["grads"][name]
                      for r in range(w)) / w
            want = expected["grads"][name] / w
            if want.abs().max().item() <= 1e-9 * largest:
                note("grad_zero_in_exact", ddp, want, largest / w)
                continue
            kind = "grad_weight" if name.endswith("weight") else "grad_bias"
            note(kind, ddp, want)
    for r in range(w):
        for source in ("running", "server"):
            got = ranks[r][source]
            if len(got) != len(ref["running"]):
                raise AssertionError("%s: %d layers with running stats, "
                                     "torch %d" % (source, len(got),
                                                   len(ref["running"])))
            for (m, v, n), (em, ev, en) in zip(got, ref["running"]):
                note("running_mean", m, em)
                note("running_var", v, ev)
                if n != en:
                    raise AssertionError("rank %d %s num_batches_tracked %d"
                                         ", torch %d" % (r, source, n, en))
        note("eval_output", ranks[r]["eval"], ref["eval"])
    return errors


class TorchCompatTest(unittest.TestCase):
    """One run of every case; one test method per case."""

    @classmethod
    def setUpClass(cls):
        start = time.time()
        cls.aggregator = harness.Aggregator(["--round_timeout_ms=20000"])
        cls.out = tempfile.mkdtemp(prefix="workers-",
                                   dir=os.environ.get("TEST_TMPDIR"))
        names = ",".join(c["name"] for c in cases.CASES)
        run_id = uuid.uuid4().hex[:8]
        procs = []
        for rank in range(WORLD_SIZE):
            cmd = [harness.PYTHON, os.path.join(harness.HERE, "worker.py"),
                   "--address=" + cls.aggregator.address,
                   "--run_id=" + run_id, "--cases=" + names,
                   "--world_size=%d" % WORLD_SIZE, "--rank=%d" % rank,
                   "--out=" + cls.out]
            procs.append(subprocess.Popen(
                cmd, env=harness.child_env(), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT))
        # The references, while the workers run.
        cls.refs = {c["name"]: cases.reference_run(c) for c in cases.CASES}
        failures = harness.wait_workers(procs, timeout=240)
        cls.aggregator.stop()
        if failures:
            raise RuntimeError("workers failed:\n" + "\n".join(failures) +
                               "\naggregator log:\n" +
                               open(cls.aggregator.log_path).read()[-3000:])
        cls.ranks = [torch.load(os.path.join(cls.out, "rank%d.pt" % r))
                     for r in range(WORLD_SIZE)]
        cls.seconds = time.time() - start
        cls.table = []

    @classmethod
    def tearDownClass(cls):
        lines = ["", "worst relative error per case (%d workers, %.1f s):"
                 % (WORLD_SIZE, cls.seconds)]
        for name, errors in cls.table:
            worst = max(errors.values())
            lines.append("  %-34s %.2e  (%s)" % (
                name, worst, ", ".join("%s %.1e" % kv
                                       for kv in sorted(errors.items()))))
        sys.stderr.write("\n".join(lines) + "\n")

    def check_case(self, case):
        ranks = [self.ranks[r][case["name"]] for r in range(WORLD_SIZE)]
        errors = compare(case, ranks, self.refs[case["name"]])
        self.table.append((case["name"], errors))
        tol = cases.tolerance(case)
        bad = {k: v for k, v in errors.items() if not v <= tol}
        self.assertFalse(bad, "%s: relative errors above %g: %s" % (
            case["name"], tol, bad))
        for r in range(WORLD_SIZE):
            keys = ranks[r]["state_keys"]
            self.assertTrue(all(k.rsplit(".", 1)[-1] in (
                "weight", "bias", "running_mean", "running_var",
                "num_batches_tracked") for k in keys), keys)


def _make_test(case):
    def test(self):
        self.check_case(case)
    test.__name__ = "test_" + case["name"]
    return test


for _case in cases.CASES:
    setattr(TorchCompatTest, "test_" + _case["name"], _make_test(_case))


if __name__ == "__main__":
    unittest.main(verbosity=2)
