"""Autograd beyond one backward per forward, on W = 3 worker processes
against one real aggregator, each checked against torch's BatchNorm in
float64 on the concatenated batch:

* a gradient penalty (torch.autograd.grad(..., create_graph=True)) through
  a training layer, alone and as WGAN-GP's loss + 10 * penalty, is torch's
  double backward (torch.nn.SyncBatchNorm raises), and a plain step runs
  after it;
* three backwards through one forward (retain_graph=True, as PCGrad and
  GradNorm run them) are each torch's: every backward is its own round.

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


def reference(seeds, penalty=None):
    """torch in float64 on the whole batch: per upstream seed, the input
    gradient and the parameter gradients of sum(out * dy); with `penalty`
    (autograd_cases.PENALTY_MODES), those of its double backward
    instead."""
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
            ac.penalty_loss(penalty, loss, g).backward(retain_graph=True)
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

    def test_double_backward_is_torchs(self):
        """A gradient penalty through a training layer: torch's double
        backward on the concatenated batch, to the input, the conv and the
        BN weights, where torch.nn.SyncBatchNorm raises (before, syncnorm
        gave a conv gradient off by 194 and none for the BN weight, with no
        error). Alone and as WGAN-GP's loss + 10 * penalty; then a plain
        step runs on."""
        records = self.scenario("penalty")
        for mode in ac.PENALTY_MODES:
            (want,) = reference([1], penalty=mode)
            # The penalty reaches the conv and the BN weight.
            for name in ("0.weight", "1.weight"):
                self.assertGreater(want["grads"][name].abs().max().item(),
                                   1e-3, name)
            self.check_gradients([rec[mode] for rec in records], want)
        self.check_gradients([rec["next"] for rec in records],
                             reference([1])[0])

    def test_double_backward_of_apexs_fused_layer_is_torchs(self):
        """channel_last, a residual z and the fused ReLU, as apex's layer
        runs: WGAN-GP's loss + 10 * penalty, against torch's BatchNorm in
        float64 on the concatenated batch."""
        records = self.scenario("apex")
        x, z = (t.double().requires_grad_() for t in ac.apex_inputs())
        weight, bias = (t.double().requires_grad_()
                        for t in ac.apex_affine())
        out = torch.relu(torch.nn.functional.batch_norm(
            x.movedim(-1, 1), None, None, weight, bias, True, 0.0,
            1e-5).movedim(1, -1) + z)
        loss = (out * ac.apex_upstream().double()).sum()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        ac.penalty_loss("gp", loss, g).backward()
        for rank, rec in enumerate(records):
            self.assertLess(harness.rel_error(
                rec["dx"], ac.shard(x.grad, rank)), TOLERANCE)
            self.assertLess(harness.rel_error(
                rec["dz"], ac.shard(z.grad, rank)), TOLERANCE)
        for name, want in (("weight", weight.grad), ("bias", bias.grad)):
            total = sum(rec["grads"][name] for rec in records)
            self.assertLess(harness.rel_error(total, want), TOLERANCE, name)

    def test_each_backward_through_one_forward_is_torchs(self):
        """torch's SyncBatchNorm all-reduces once per backward: each of
        three backwards through one forward gives torch's gradients of its
        own upstream gradient (before, the second was refused by the
        server as a conflicting retry of the first), and the next step
        runs on."""
        records = self.scenario("several")
        for k, want in enumerate(reference(ac.SEEDS)):
            self.check_gradients([rec["backwards"][k] for rec in records],
                                 want)
        # The next step: the same batch, loss out.sum() (upstream ones).
        m = ac.model().double()
        x = ac.batch().double().requires_grad_()
        m(x).sum().backward()
        self.check_gradients([rec["next"] for rec in records],
                             {"dx": x.grad, "grads": ac.grads(m)})


if __name__ == "__main__":
    unittest.main()
