"""Uneven inputs under torch's Join, which torch.nn.SyncBatchNorm cannot do
(its forward's collectives hang): W = 4 worker processes over gloo train
7, 5, 5 and 2 batches per epoch for 2 epochs with ``Join([ddp_model,
session])``, with ``Join([session])`` alone, with process groups
[0, 2] / [1, 3], and with DDP over a job spread on 2 shards. Each step's
outputs and input gradients equal torch's BatchNorm in float64 on the
concatenated batches of the ranks of the group still training at that
step; after each epoch every rank's buffers and the aggregator's
statistics equal the reference's running statistics, and every rank
continues at the same step. Epochs of equal length change no membership;
a rank that dies is no join: the others' rounds fail with
DEADLINE_EXCEEDED naming it."""

import os
import tempfile
import unittest
import uuid

import torch

import drop_in
import harness
import join_worker as jw

TOLERANCE = 1e-5
WORLD_SIZE = len(jw.LENGTHS)


def check(records, name):
    drop_in.reraise(records)
    seed, _, grouped, _, lengths = jw.SCENARIOS[name]
    groups = jw.GROUPS if grouped else [list(range(WORLD_SIZE))]
    models = [drop_in.torch_model(seed) for _ in groups]
    e = drop_in.Errors()
    first = records[0]["first"]
    for epoch in range(jw.EPOCHS):
        x_seed = jw.data_seed(seed, epoch)
        for b in range(max(lengths)):
            x, r = drop_in.global_batch(x_seed, b)
            for group, model in zip(groups, models):
                present = [k for k in group if lengths[k] > b]
                if not present:
                    continue
                want = drop_in.reference_step(
                    model, drop_in.group_rows(x, present),
                    drop_in.group_rows(r, present))
                got = {k: records[k]["steps"][(epoch, b)] for k in present}
                e.step("epoch %d batch %d" % (epoch, b), got, want, present,
                       [drop_in.SHARDS[k] if k in present else 0
                        for k in range(WORLD_SIZE)], grads=False)
        for group, model in zip(groups, models):
            for k in group:
                rec = records[k]["epochs"][epoch]
                e.stats("epoch %d rank %d buffers" % (epoch, k),
                        rec["buffers"], drop_in.buffers(model))
                e.stats("epoch %d rank %d service" % (epoch, k),
                        rec["service"], drop_in.buffers(model))
        want_next = [s + max(lengths) * (epoch + 1) for s in first]
        for k in range(WORLD_SIZE):
            got_next = records[k]["epochs"][epoch]["next"]
            e.expect(got_next == want_next,
                     "rank %d continues at steps %s after epoch %d, expected "
                     "%s" % (k, got_next, epoch, want_next))
    return e


class JoinTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.aggregator = harness.Aggregator(["--round_timeout_ms=20000"])
        cls.shards = [harness.Aggregator(["--round_timeout_ms=20000"])
                      for _ in range(2)]
        cls.out = tempfile.mkdtemp(prefix="join-",
                                   dir=os.environ.get("TEST_TMPDIR"))
        run_id = "join-" + uuid.uuid4().hex[:8]
        procs = harness.launch_gloo_workers(
            "join_worker.py", WORLD_SIZE,
            ["--run_id=" + run_id, "--out=" + cls.out],
            {"SYNCNORM_ADDRESS": cls.aggregator.address,
             "JOIN_SHARDS": ",".join(a.address for a in cls.shards)})
        cls.failures = harness.wait_workers(procs, timeout=200)
        for aggregator in [cls.aggregator] + cls.shards:
            aggregator.stop()
        cls.records = None
        if not cls.failures:
            cls.records = [torch.load(os.path.join(cls.out, "rank%d.pt" % r))
                           for r in range(WORLD_SIZE)]

    def scenario(self, name):
        self.assertFalse(self.failures, "workers failed:\n" +
                         "\n".join(self.failures))
        return [r.get(name, {"error": "not run (an earlier scenario failed)"})
                for r in self.records]

    def assert_close(self, name):
        errors = check(self.scenario(name), name)
        bad = {k: v for k, v in errors.worst.items() if not v <= TOLERANCE}
        self.assertFalse(bad or errors.problems,
                         "relative errors above %g: %s\n%s" % (
                             TOLERANCE, bad, "\n".join(errors.problems)))

    def test_ddp_and_session_under_join(self):
        self.assert_close("ddp")

    def test_session_alone_under_join(self):
        self.assert_close("plain")

    def test_process_groups_under_join(self):
        self.assert_close("groups")

    def test_two_shards_under_join(self):
        self.assert_close("shards")

    def test_an_even_epoch_changes_no_membership(self):
        self.assert_close("even")
        for k, rec in enumerate(self.scenario("even")):
            self.assertEqual(len(set(rec["versions"])), 1,
                             "rank %d saw membership versions %s over the "
                             "epochs" % (k, rec["versions"]))

    def test_a_rank_that_dies_is_a_deadline_naming_it(self):
        records = self.scenario("dies")
        drop_in.reraise(records)
        for k in range(WORLD_SIZE):
            if k == jw.DEAD_RANK:
                self.assertTrue(records[k].get("died"))
                continue
            self.assertEqual(records[k]["code"], "DEADLINE_EXCEEDED",
                             records[k]["message"])
            self.assertIn("waiting for ranks [%d]" % jw.DEAD_RANK,
                          records[k]["message"])


if __name__ == "__main__":
    unittest.main()
