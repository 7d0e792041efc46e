"""Autograd beyond one backward per forward, on W = 3 worker processes
against one real aggregator, each checked against torch's BatchNorm in
float64 on the concatenated batch:

* a gradient penalty (torch.autograd.grad(..., create_graph=True)) through
  a training layer raises a clear error before its round, where torch's
  double backward is what an exact one would have to give, and the
  forward's first-order backward still works after it;
* of two backwards through one forward (retain_graph=True), the first is
  torch's and the second raises a clear error before any round (each
  backward as its own round needs the wire's round identity to name it).

Relative errors at most 1e-5."""

import os
import subprocess
import tempfile
import unittest
import uuid

import torch

import autograd_cases as ac
import harness

TOLERANCE = 1e-5


def reference(seeds, penalty=False):
    """torch in float64 on the whole batch: per upstream seed, the input
    gradient and the parameter gradients of sum(out * dy); with `penalty`,
    those of the gradient penalty of the first instead."""
    m = ac.model().double()
    x = ac.batch().double().requires_grad_()
    out = m(x)
    results = []
    for k, seed in enumerate(seeds):
        m.zero_grad(set_to_none=True)
        x.grad = None
        loss = (out * ac.upstream(seed).double()).sum()
        if penalty:
            (g,) = torch.autograd.grad(loss, x, create_graph=True)
            g.pow(2).sum().backward()
        else:
            loss.backward(retain_graph=True)
        results.append({"dx": x.grad.clone(), "grads": ac.grads(m)})
    return results


class AutogradTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.aggregator = harness.Aggregator(["--round_timeout_ms=20000"])
        out = tempfile.mkdtemp(prefix="autograd-",
                               dir=os.environ.get("TEST_TMPDIR"))
        run_id = uuid.uuid4().hex[:8]
        procs = [subprocess.Popen(
            [harness.PYTHON, os.path.join(harness.HERE, "autograd_worker.py"),
             "--address=" + cls.aggregator.address, "--run_id=" + run_id,
             "--rank=%d" % r, "--out=" + out],
            env=harness.child_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT) for r in range(ac.WORLD_SIZE)]
        failures = harness.wait_workers(procs, timeout=120)
        cls.aggregator.stop()
        if failures:
            raise RuntimeError("workers failed:\n" + "\n".join(failures))
        cls.ranks = [torch.load(os.path.join(out, "rank%d.pt" % r))
                     for r in range(ac.WORLD_SIZE)]

    def scenario(self, name):
        records = [r[name] for r in self.ranks]
        for rank, rec in enumerate(records):
            self.assertNotIn("failed", rec, "rank %d: %s" % (
                rank, rec.get("failed")))
        return records

    def check_gradients(self, records, want):
        """Each rank's input gradient is its rows of torch's; the
        parameter gradients summed over ranks are torch's (DDP averages
        them: the same up to 1/W)."""
        for rank, rec in enumerate(records):
            self.assertLess(harness.rel_error(
                rec["dx"], ac.shard(want["dx"], rank)), TOLERANCE)
        largest = max(g.abs().max().item() for g in want["grads"].values())
        for name, g in want["grads"].items():
            total = sum(rec["grads"][name] for rec in records)
            # The conv bias before a BN has gradient 0 in exact arithmetic:
            # rounding noise on both sides, checked against the largest.
            floor = largest if name == "0.bias" else 0.0
            self.assertLess(harness.rel_error(total, g, floor), TOLERANCE,
                            name)

    def test_gradient_penalty_raises_a_clear_error(self):
        records = self.scenario("penalty")
        for rank, rec in enumerate(records):
            self.assertIn("has no double backward", rec["error"],
                          "rank %d" % rank)
            self.assertIn("create_graph=True", rec["error"])
        # What an exact double backward would be compared with: torch's
        # penalty gradients, which reach the conv and the BN weights.
        (penalty,) = reference([1], penalty=True)
        for name in ("0.weight", "1.weight"):
            self.assertTrue(torch.isfinite(penalty["grads"][name]).all())
            self.assertGreater(penalty["grads"][name].abs().max().item(),
                               1e-3, name)
        # The failed attempt ran no round: the first-order backward of the
        # same forward is the step's backward round.
        self.check_gradients(records, reference([1])[0])

    def test_second_backward_through_one_forward_raises_a_clear_error(self):
        """The service syncs one backward round per forward step: the first
        backward is torch's, a second raises saying so before any round
        (not the server's ABORTED about a retry), and the job goes on."""
        records = self.scenario("twice")
        self.check_gradients([rec["first"] for rec in records],
                             reference([1])[0])
        for rank, rec in enumerate(records):
            self.assertIn("ran a second backward through one training "
                          "forward (step 0", rec["error"], "rank %d" % rank)


if __name__ == "__main__":
    unittest.main()
