"""syncnorm.torch.precise_bn on W = 4 worker processes against one real
aggregator (precise_bn_worker.py). Each rank trains the model a few steps
(its running statistics are then far from its batches'), then runs
precise_bn on its own batches (3, 2, 4 and 1 of different sizes). Against
float64 torch on the batches of every rank of the group
(precise_bn_cases.reference):

* exact (default): every layer's running_mean and running_var in every
  rank's buffers and on the service are the population mean and unbiased
  variance of its input at inference, layer by layer in forward order
  (which is not the layers' modules() order);
* one_pass=True: those of its input in one training-mode pass;
* process groups [[0, 2], [1, 3]]: each group's own statistics;
* a rank SIGKILLed in the middle: the others raise ServiceError naming
  the layer and the missing rank, their buffers and the job's statistics
  bit for bit as before, the scratch job gone.

Tolerance: relative error (to the largest value of the vector) <= 1e-6.
The workers run the model in float32 and the buffers are float32 (24-bit
significands: 6e-8 each); the float32 convolutions in front of a layer
add a few ulps more. The service's float64 statistics are compared at the
same tolerance, since they are the float64 merge of float32 activations.
"""

import os
import subprocess
import tempfile
import unittest
import uuid

import torch

import harness
import precise_bn_cases as cases

TOLERANCE = 1e-6


class PreciseBnTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.aggregator = harness.Aggregator(["--round_timeout_ms=20000"])
        out = tempfile.mkdtemp(prefix="precise-bn-",
                               dir=os.environ.get("TEST_TMPDIR"))
        run_id = uuid.uuid4().hex[:8]
        procs = [subprocess.Popen(
            [harness.PYTHON,
             os.path.join(harness.HERE, "precise_bn_worker.py"),
             "--address=" + cls.aggregator.address, "--run_id=" + run_id,
             "--rank=%d" % r, "--out=" + out],
            env=harness.child_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT) for r in range(cases.WORLD_SIZE)]
        cls.exit_codes = []
        failures = []
        for rank, p in enumerate(procs):
            try:
                text, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            cls.exit_codes.append(p.returncode)
            expected = -9 if rank == cases.KILL_RANK else 0
            if p.returncode != expected:
                failures.append("--- rank %d (exit %s) ---\n%s" % (
                    rank, p.returncode, text.decode(errors="replace")[-6000:]))
        cls.aggregator.stop()
        if failures:
            raise RuntimeError("workers failed:\n" + "\n".join(failures))
        cls.results = {
            name: {r: torch.load(path) for r in range(cases.WORLD_SIZE)
                   for path in [os.path.join(out, "%s-rank%d.pt" % (name, r))]
                   if os.path.exists(path)}
            for name in cases.SCENARIOS}

    def scenario(self, name):
        records = self.results[name]
        for rank, rec in records.items():
            self.assertNotIn("failed", rec, "rank %d: %s" % (
                rank, rec.get("failed")))
        return records

    def check_against_reference(self, name):
        records = self.scenario(name)
        one_pass, groups, _ = cases.SCENARIOS[name]
        groups = groups or [list(range(cases.WORLD_SIZE))]
        for ranks in groups:
            xs = [x for r in ranks for x in cases.batches(name, r)]
            want = cases.reference(records[ranks[0]]["state_dict"], xs,
                                   one_pass)
            for r in ranks:
                self.check_rank(records[r], want, "%s rank %d" % (name, r))
            # The group's committer deleted its scratch job.
            committer = records[min(ranks)]
            self.assertEqual([j for j in committer["scratch_jobs"]
                              if j.endswith(".g%d" % committer["group"])],
                             [], name)
        return records

    def check_rank(self, rec, want, where):
        self.assertNotIn("error", rec, where)
        self.assertTrue(rec["modes_restored"], where)
        self.assertEqual(rec["result"],
                         {n: c for n, (c, _, _) in want.items()}, where)
        for k, v in rec["before"]["params"].items():
            self.assertTrue(torch.equal(v, rec["after"]["params"][k]),
                            "%s: weight %s changed" % (where, k))
        for layer, (_, mean, var) in want.items():
            at = "%s layer %s" % (where, layer)
            mean_b, var_b, nbt = rec["after"]["buffers"][layer]
            service = rec["after"]["service"][layer]
            old = rec["before"]["service"][layer]["num_batches_tracked"]
            self.assertEqual(rec["before"]["buffers"][layer][2], old, at)
            # Away from the truth before, on it after.
            self.assertGreater(harness.rel_error(
                rec["before"]["buffers"][layer][0], mean), 1e-2, at)
            for got, ref, what in ((mean_b, mean, "running_mean"),
                                   (var_b, var, "running_var"),
                                   (service["running_mean"], mean, "mean"),
                                   (service["running_var"], var, "var")):
                self.assertLessEqual(harness.rel_error(got, ref), TOLERANCE,
                                     "%s %s" % (at, what))
            self.assertEqual(nbt, old + 1, at)
            self.assertEqual(service["num_batches_tracked"], old + 1, at)
            # The job's statistics are the buffers'.
            for buf, key in ((mean_b, "running_mean"),
                             (var_b, "running_var")):
                self.assertTrue(torch.equal(buf, torch.tensor(
                    service[key], dtype=torch.float64).float()), at)

    def test_exact_statistics_at_inference(self):
        """Layer by layer in forward order, eval mode, over every rank."""
        self.check_against_reference("exact")

    def test_one_pass_is_fvcores_with_exact_moments(self):
        self.check_against_reference("one_pass")

    def test_groups_merge_within_their_group(self):
        records = self.check_against_reference("groups")
        self.assertEqual([records[r]["group"] for r in range(4)],
                         [0, 1, 0, 1])
        # Each group's statistics are its own.
        means = [records[r]["after"]["buffers"]["bn_a"][0] for r in (0, 1)]
        self.assertFalse(torch.equal(*means))

    def test_a_rank_killed_midway_changes_nothing(self):
        records = self.results["kill"]
        self.assertEqual(self.exit_codes[cases.KILL_RANK], -9)
        self.assertNotIn(cases.KILL_RANK, records)
        for rank, rec in records.items():
            where = "rank %d" % rank
            self.assertNotIn("failed", rec, where)
            error = rec.get("error")
            self.assertIsNotNone(error, where)
            self.assertEqual(error["type"], "ServiceError", where)
            self.assertEqual(error["code"], "DEADLINE_EXCEEDED", where)
            # The second layer in forward order: bn_b.
            self.assertIn("failed at layer 2 ('bn_b'", error["text"], where)
            self.assertIn("[%d]" % cases.KILL_RANK, error["text"], where)
            self.assertIn("nothing was changed", error["text"], where)
            self.assertIn("restored as they were", error["text"], where)
            self.assertTrue(rec["modes_restored"], where)
            before, after = rec["before"], rec["after"]
            for layer, (mean, var, nbt) in before["buffers"].items():
                mean_a, var_a, nbt_a = after["buffers"][layer]
                self.assertTrue(torch.equal(mean, mean_a), where)
                self.assertTrue(torch.equal(var, var_a), where)
                self.assertEqual(nbt, nbt_a, where)
            self.assertEqual(before["service"], after["service"], where)
            self.assertEqual(rec["scratch_jobs"], [], where)


if __name__ == "__main__":
    unittest.main()
