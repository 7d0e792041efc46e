"""The elastic example (examples/elastic_cnn.py) against the real aggregator:
4 ranks, one leaves, one is killed and removed, three join (4 -> 3 -> 2 ->
5 ranks). Its running statistics are replayed in float64 with numpy from
the BN inputs every worker recorded: per step, the mean and unbiased
variance of the concatenated batch of the members in force at that step
(the plan's, written here), then torch's momentum update. The
aggregator's statistics, the buffers of the ranks that joined (when they
attached), of the rank that left and of every rank at the end must be
those."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import harness

EXAMPLE = os.path.join(harness.HERE, "..", "examples", "elastic_cnn.py")
PHASE = 2  # steps per phase
STEPS = 4 * PHASE
MOMENTUM = 0.1  # torch's default, the example's layers'


def members_at(step):
    """The plan: ranks 0-3, rank 3 leaves, rank 2 is removed, 3, 4, 5
    join; each from the first step of its phase."""
    plan = [(0, [0, 1, 2, 3]), (PHASE, [0, 1, 2]), (2 * PHASE, [0, 1]),
            (3 * PHASE, [0, 1, 3, 4, 5])]
    return [ranks for first, ranks in plan if step >= first][-1]


def channels_first(x):
    """(C, values) of an (N, C) or (N, C, H, W) batch, float64."""
    x = np.asarray(x, dtype=np.float64)
    return np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)


def replay(record):
    """The running statistics after each step: after[s][layer] = (mean,
    var, num_batches_tracked)."""
    after = []
    running = None
    for step in range(STEPS):
        inputs = [np.load(os.path.join(record, "r%d-s%d.npz" % (r, step)))
                  for r in members_at(step)]
        layers = sorted(int(k) for k in inputs[0].files)
        if running is None:
            running = {l: (np.zeros(channels_first(inputs[0][str(l)])
                                    .shape[0]),
                           np.ones(channels_first(inputs[0][str(l)])
                                   .shape[0])) for l in layers}
        now = {}
        for l in layers:
            x = np.concatenate([channels_first(i[str(l)]) for i in inputs],
                               axis=1)
            mean, var = x.mean(axis=1), x.var(axis=1, ddof=1)
            rmean, rvar = running[l]
            running[l] = ((1 - MOMENTUM) * rmean + MOMENTUM * mean,
                          (1 - MOMENTUM) * rvar + MOMENTUM * var)
            now[l] = running[l] + (step + 1,)
        after.append(now)
    return after


class ElasticExampleTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.record = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        env = harness.child_env()
        env["SYNCNORM_AGGREGATOR"] = harness.aggregator_binary()
        p = subprocess.run(
            [harness.PYTHON, EXAMPLE, "--phase=%d" % PHASE, "--batch=5",
             "--record=" + cls.record],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            timeout=180)
        cls.out = p.stdout.decode(errors="replace")
        cls.code = p.returncode
        cls.summary = None
        path = os.path.join(cls.record, "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                cls.summary = json.load(f)
        cls.after = replay(cls.record) if cls.code == 0 else None

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.record, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.code, 0, self.out[-6000:])
        self.assertIsNotNone(self.summary, self.out[-3000:])

    def buffers(self, tag):
        f = np.load(os.path.join(self.record, tag + ".npz"))
        layers = sorted({int(k.split("_")[0]) for k in f.files})
        return {l: (f["%d_running_mean" % l], f["%d_running_var" % l],
                    int(f["%d_num_batches_tracked" % l])) for l in layers}

    def assert_stats(self, got, expected, tolerance, what):
        self.assertEqual(sorted(got), sorted(expected), what)
        for l in expected:
            mean, var, nbt = got[l]
            emean, evar, enbt = expected[l]
            self.assertEqual(nbt, enbt, "%s layer %d" % (what, l))
            self.assertLessEqual(harness.rel_error(mean, emean), tolerance,
                                 "%s layer %d running_mean" % (what, l))
            self.assertLessEqual(harness.rel_error(var, evar), tolerance,
                                 "%s layer %d running_var" % (what, l))

    def test_the_membership_followed_the_plan(self):
        membership = self.summary["job"]["membership"]
        history = membership["history"]
        for step in range(STEPS):
            in_force = [c for c in history if c["step"] <= step][-1]
            self.assertEqual(in_force["members"], members_at(step),
                             "step %d: %s" % (step, history))
        self.assertEqual(membership["members"], [0, 1, 3, 4, 5])
        versions = [c["version"] for c in history]
        self.assertEqual(versions, sorted(set(versions)), history)
        left = [c for c in history if c.get("left")]
        removed = [c for c in history if c.get("removed")]
        self.assertEqual([(c["step"], c["left"]) for c in left],
                         [(PHASE, [3])])
        self.assertEqual([(c["step"], c["removed"]) for c in removed],
                         [(2 * PHASE, [2])])
        joined = sorted(r for c in history for r in c.get("joined", []))
        self.assertEqual(joined, [3, 4, 5])
        self.assertEqual(self.summary["codes"]["r2"], -9)  # SIGKILL

    def test_the_aggregator_has_the_replayed_statistics(self):
        got = {e["layer"]: (np.array(e["running_mean"]),
                            np.array(e["running_var"]),
                            e["num_batches_tracked"])
               for e in self.summary["stats"]["layers"]}
        self.assert_stats(got, self.after[-1], 1e-9, "aggregator")

    def test_joiners_started_from_the_statistics_before_their_step(self):
        for rank in (3, 4, 5):
            self.assert_stats(self.buffers("j%d-attached" % rank),
                              self.after[3 * PHASE - 1], 1e-6,
                              "rank %d when it joined" % rank)
            # and ran the steps from there on: one file per step
            for step in range(STEPS):
                self.assertEqual(
                    os.path.exists(os.path.join(
                        self.record, "r%d-s%d.npz" % (rank, step))),
                    rank in members_at(step), "rank %d step %d" % (rank, step))

    def test_the_leaver_had_the_statistics_of_its_last_step(self):
        self.assert_stats(self.buffers("r3-left"), self.after[PHASE - 1],
                          1e-6, "rank 3 when it left")

    def test_every_rank_ends_with_the_replayed_statistics(self):
        for tag in ("r0", "r1", "j3", "j4", "j5"):
            self.assert_stats(self.buffers(tag + "-final"), self.after[-1],
                              1e-6, tag + " at the end")


if __name__ == "__main__":
    unittest.main(verbosity=2)
