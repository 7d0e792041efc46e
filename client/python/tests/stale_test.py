"""Stale-synchronous jobs (attach(..., staleness=tau)) with real processes:
three worker processes (stale_worker.py) train two SyncBatchNorm layers on
inputs the test knows, rank 2 sleeping before every step, in three jobs:
synchronous with no one slow, staleness 2 and staleness 0 (both with the
slow rank). Checked against float64 numpy, never against syncnorm:

* staleness 2: each answer's outputs and input gradients are those of the
  rank-order Chan merge (and gradient sums) of exactly the (rank, step)s
  its view names; every view lies within [s - 2, s] and names every rank
  (no rank is answered more than 2 steps ahead of the slowest, nor before
  every rank has sent its first step); the fast ranks did run ahead; the buffers lag until
  state_dict(), which loads the aggregator's statistics, and those equal
  the synchronous job's bit for bit (and torch's BatchNorm in float64 on
  the concatenated batches); a momentum change raises ValueError.
* staleness 0: outputs, gradients and statistics equal the synchronous
  job's bit for bit, with empty views.
"""

import os
import subprocess
import tempfile
import unittest
import uuid

import numpy as np
import torch
import torch.nn as nn

import harness
import stale_worker as worker

WORLD = 3
TAU = 2
EPS = 1e-5


def moments(x):
    """float64 (n, mean, M2) per channel of an (N, C, ...) tensor."""
    a = x.double().numpy()
    a = np.moveaxis(a, 1, -1).reshape(-1, a.shape[1])
    mean = a.mean(axis=0)
    return float(a.shape[0]), mean, ((a - mean) ** 2).sum(axis=0)


def chan(parts):
    """Chan's merge, in order, of (n, mean, M2) parts."""
    n, mean, m2 = parts[0]
    mean, m2 = mean.copy(), m2.copy()
    for nb, mb, m2b in parts[1:]:
        total = n + nb
        delta = mb - mean
        m2 = m2 + m2b + delta * delta * n * nb / total
        mean = mean + delta * nb / total
        n = total
    return n, mean, m2


def per_channel(v, like):
    """v (C,) shaped to broadcast over an (N, C, ...) tensor like `like`."""
    return v.reshape((1, -1) + (1,) * (like.dim() - 2))


class StaleTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        out = tempfile.mkdtemp(prefix="stale-",
                               dir=os.environ.get("TEST_TMPDIR"))
        tag = uuid.uuid4().hex[:8]
        cls.jobs = {"sync": "sync-" + tag, "stale": "stale-" + tag,
                    "tau0": "tau0-" + tag}
        spec = ",".join([cls.jobs["sync"] + ":0:fast",
                         cls.jobs["stale"] + ":%d:slow" % TAU,
                         cls.jobs["tau0"] + ":0:slow"])
        with harness.Aggregator() as aggregator:
            procs = [subprocess.Popen(
                [harness.PYTHON, os.path.join(harness.HERE,
                                              "stale_worker.py"),
                 "--address=" + aggregator.address, "--jobs=" + spec,
                 "--rank=%d" % r, "--world_size=%d" % WORLD, "--out=" + out],
                env=harness.child_env(), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT) for r in range(WORLD)]
            failures = harness.wait_workers(procs, timeout=120)
            if failures:
                raise AssertionError("\n".join(failures) +
                                     "\naggregator log:\n" + open(
                                         aggregator.log_path).read()[-3000:])
        ranks = [torch.load(os.path.join(out, "rank%d.pt" % r))
                 for r in range(WORLD)]
        cls.runs = {k: [ranks[r][job] for r in range(WORLD)]
                    for k, job in cls.jobs.items()}

    def test_each_stale_answer_is_the_merge_of_its_view(self):
        runs = self.runs["stale"]
        ahead = 0
        for layer in range(len(worker.LAYERS)):
            # The float64 answer of every (rank, step), from its view; a
            # backward's sums use each contributor's own answer's mean.
            answer = {}
            for s in range(worker.STEPS):
                for r in range(WORLD):
                    view = runs[r]["steps"][s]["view"][layer]
                    answer[r, s] = (view, chan([moments(worker.data(
                        q, t, layer)[0]) for q, t in view]))

            def grad_sums(q, t):
                x, dy = worker.data(q, t, layer)
                _, (n, mean, m2) = answer[q, t]
                xmu = x.double() - per_channel(torch.from_numpy(mean), x)
                dims = [0] + list(range(2, x.dim()))
                return (dy.double().sum(dims).numpy(),
                        (dy.double() * xmu).sum(dims).numpy())

            for r in range(WORLD):
                for s in range(worker.STEPS):
                    where = "layer %d rank %d step %d" % (layer, r, s)
                    view, (n, mean, m2) = answer[r, s]
                    # The bound and the clock condition.
                    self.assertIn((r, s), view, where)
                    self.assertEqual([q for q, _ in view],
                                     sorted({q for q, _ in view}), where)
                    for q, t in view:
                        self.assertTrue(s - TAU <= t <= s, (where, view))
                    self.assertEqual(len(view), WORLD, (where, view))
                    ahead += any(t < s for _, t in view) or \
                        len(view) < WORLD
                    # Forward: normalized with the view's merge.
                    x, dy = worker.data(r, s, layer)
                    m = per_channel(torch.from_numpy(mean), x)
                    invstd = per_channel(torch.from_numpy(
                        1.0 / np.sqrt(m2 / n + EPS)), x)
                    y = (x.double() - m) * invstd
                    got = runs[r]["steps"][s]
                    self.assertLess(harness.rel_error(got["y"][layer], y),
                                    1e-5, where)
                    # Backward: the view's gradient sums.
                    sums = [grad_sums(q, t) for q, t in view]
                    mean_dy = per_channel(torch.from_numpy(
                        sum(a for a, _ in sums) / n), x)
                    mean_dy_xmu = per_channel(torch.from_numpy(
                        sum(b for _, b in sums) / n), x)
                    dx = (dy.double() - mean_dy - (x.double() - m) *
                          invstd ** 2 * mean_dy_xmu) * invstd
                    self.assertLess(harness.rel_error(got["dx"][layer], dx),
                                    1e-5, where)
        self.assertGreater(ahead, 0, "the fast ranks never ran ahead")

    def test_stale_statistics_equal_the_synchronous_jobs(self):
        sync, stale = self.runs["sync"], self.runs["stale"]
        for r in range(WORLD):
            self.assertEqual(stale[r]["staleness"], TAU)
            self.assertEqual(sync[r]["staleness"], 0)
            # The rounds did not move the buffers; state_dict loaded them.
            self.assertEqual(stale[r]["behind"], [True, True])
            for layer in range(len(worker.LAYERS)):
                self.assertEqual(stale[r]["buffers_before"][layer][2], 0)
                for key in ("state_dict", "buffers_after"):
                    got, want = stale[r][key][layer], sync[r][key][layer]
                    self.assertTrue(torch.equal(got[0], want[0]), (r, key))
                    self.assertTrue(torch.equal(got[1], want[1]), (r, key))
                    self.assertEqual(got[2], want[2])
                server = stale[r]["server"]["layers"][layer]
                self.assertEqual(server["num_batches_tracked"], worker.STEPS)
                self.assertEqual(
                    server["running_mean"],
                    sync[r]["server"]["layers"][layer]["running_mean"])
                self.assertEqual(
                    server["running_var"],
                    sync[r]["server"]["layers"][layer]["running_var"])
                self.assertTrue(torch.equal(
                    stale[r]["buffers_after"][layer][0],
                    torch.tensor(server["running_mean"]).float()))
            self.assertIn("stale-synchronous", stale[r]["momentum_error"])
            self.assertIn("momentum", stale[r]["momentum_error"])
        # The synchronous job against torch in float64.
        for layer, (channels, rest) in enumerate(worker.LAYERS):
            bn = (nn.BatchNorm1d if len(rest) <= 1 else nn.BatchNorm2d)(
                channels).double()
            for s in range(worker.STEPS):
                bn(torch.cat([worker.data(r, s, layer)[0]
                              for r in range(WORLD)]).double())
            for r in range(WORLD):
                mean, var, nbt = sync[r]["buffers_after"][layer]
                self.assertLess(harness.rel_error(mean, bn.running_mean),
                                1e-6)
                self.assertLess(harness.rel_error(var, bn.running_var), 1e-6)
                self.assertEqual(nbt, worker.STEPS)

    def test_staleness_zero_is_the_synchronous_job_bit_for_bit(self):
        sync, tau0 = self.runs["sync"], self.runs["tau0"]
        for r in range(WORLD):
            self.assertEqual(tau0[r]["behind"], [False, False])
            for s in range(worker.STEPS):
                got, want = tau0[r]["steps"][s], sync[r]["steps"][s]
                self.assertEqual(got["view"], [(), ()])
                for key in ("y", "dx"):
                    for a, b in zip(got[key], want[key]):
                        self.assertTrue(torch.equal(a, b), (r, s, key))
            for key in ("buffers_before", "state_dict"):
                for a, b in zip(tau0[r][key], sync[r][key]):
                    self.assertTrue(torch.equal(a[0], b[0]))
                    self.assertTrue(torch.equal(a[1], b[1]))
                    self.assertEqual(a[2], b[2])


if __name__ == "__main__":
    unittest.main()
