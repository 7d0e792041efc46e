"""A checkpoint loaded on rank 0 alone, then convert -> attach -> DDP, the
documented order (DDP broadcasts rank 0's parameters and buffers at
construction, so torch users load on rank 0 only): W = 3 worker processes
over gloo attach without a race, every rank's buffers become rank 0's (or,
for a job that exists, the service's), and training equals torch's
BatchNorm in float64 on the concatenated batch from those statistics. In
this process, without torch.distributed: ranks that attach with other
statistics, or a model of other layer shapes, get an error that says what
differs and what to do."""

import os
import tempfile
import unittest
import uuid

import torch
import torch.nn as nn

import cases
import drop_in
import harness
import pretrained_worker as pw
import syncnorm
import syncnorm.torch as snt

TOLERANCE = 1e-5
WORLD_SIZE = len(pw.SHARDS)
EXISTING_STATS_SEED = 162


def reference(seed, stats_seed=None):
    """torch_model(seed) in float64 with the checkpoint's statistics, or
    with torch_model(stats_seed)'s and num_batches_tracked 0."""
    model = drop_in.torch_model(seed)
    if stats_seed is None:
        for bn in drop_in.bns(model):
            bn.num_batches_tracked.fill_(pw.PRETRAINED_BATCHES)
        return model
    source = drop_in.bns(drop_in.torch_model(stats_seed))
    with torch.no_grad():
        for bn, other in zip(drop_in.bns(model), source):
            bn.running_mean.copy_(other.running_mean)
            bn.running_var.copy_(other.running_var)
    return model


def check(records, seed, stats_seed=None):
    drop_in.reraise(records)
    e = drop_in.Errors()
    model = reference(seed, stats_seed)
    start = drop_in.buffers(model)
    for k, rec in enumerate(records):
        e.stats("rank %d after attach" % k, rec["attached"], start)
    for step in range(pw.STEPS):
        x, r = drop_in.global_batch(seed, step, pw.SHARDS)
        want = drop_in.reference_step(model, x, r)
        e.step("step %d" % step, [rec["steps"][step] for rec in records],
               want, list(range(WORLD_SIZE)), pw.SHARDS, grads=False)
        for k, rec in enumerate(records):
            e.stats("step %d rank %d buffers" % (step, k),
                    rec["steps"][step]["buffers"], drop_in.buffers(model))
            e.stats("step %d rank %d service" % (step, k),
                    rec["steps"][step]["service"], drop_in.buffers(model))
    return e


class PretrainedTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.aggregator = harness.Aggregator(["--round_timeout_ms=20000"])
        cls.client = syncnorm.Client(cls.aggregator.address)
        cls.out = tempfile.mkdtemp(prefix="pretrained-",
                                   dir=os.environ.get("TEST_TMPDIR"))
        cls.run_id = "pretrained-" + uuid.uuid4().hex[:8]
        # "existing": a job created before the run, not trained yet.
        stats = drop_in.bns(drop_in.torch_model(EXISTING_STATS_SEED))
        cls.client.create_job(cls.run_id + "-existing", WORLD_SIZE, [
            syncnorm.layer_spec(name, drop_in.CHANNELS,
                                initial_running_mean=bn.running_mean.tolist(),
                                initial_running_var=bn.running_var.tolist())
            for name, bn in zip(("bn1", "bn2"), stats)])
        procs = harness.launch_gloo_workers(
            "pretrained_worker.py", WORLD_SIZE,
            ["--run_id=" + cls.run_id, "--out=" + cls.out],
            {"SYNCNORM_ADDRESS": cls.aggregator.address})
        cls.failures = harness.wait_workers(procs, timeout=150)
        cls.records = None
        if not cls.failures:
            cls.records = [torch.load(os.path.join(cls.out, "rank%d.pt" % r))
                           for r in range(WORLD_SIZE)]

    @classmethod
    def tearDownClass(cls):
        cls.aggregator.stop()

    def scenario(self, name):
        self.assertFalse(self.failures, "workers failed:\n" +
                         "\n".join(self.failures))
        return [r.get(name, {"error": "not run (an earlier scenario failed)"})
                for r in self.records]

    def assert_close(self, errors):
        bad = {k: v for k, v in errors.worst.items() if not v <= TOLERANCE}
        self.assertFalse(bad or errors.problems,
                         "relative errors above %g: %s\n%s" % (
                             TOLERANCE, bad, "\n".join(errors.problems)))

    def test_checkpoint_on_rank0_is_every_ranks_start(self):
        self.assert_close(check(self.scenario("new"), 61))

    def test_existing_job_that_has_not_trained_wins(self):
        self.assert_close(check(self.scenario("existing"), 62,
                                EXISTING_STATS_SEED))

    # Without torch.distributed, attach cannot tell rank 0's statistics
    # from another run's: the error says so.
    def test_other_statistics_without_torch_distributed_say_what(self):
        job = self.run_id + "-nodist"
        pretrained = snt.convert_sync_batchnorm(
            drop_in.torch_model(63).float())
        snt.attach(pretrained, self.client, job, 0, 2)
        plain = snt.convert_sync_batchnorm(pw.fresh_model())
        with self.assertRaises(syncnorm.ServiceError) as caught:
            snt.attach(plain, self.client, job, 1, 2)
        text = str(caught.exception)
        self.assertEqual(caught.exception.code, "ALREADY_EXISTS")
        for part in ("layer 'bn1' (running_mean, running_var)",
                     "layer 'bn2' (running_mean, running_var)",
                     "init_process_group", "rank 0's"):
            self.assertIn(part, text)
        self.assertNotIn("delete it first", text)

    def test_other_layer_shapes_say_which_layer(self):
        job = self.run_id + "-shapes"
        snt.attach(snt.convert_sync_batchnorm(pw.fresh_model()), self.client,
                   job, 0, 2)
        other = snt.convert_sync_batchnorm(cases.TwoBN(
            nn.BatchNorm2d(drop_in.CHANNELS), nn.BatchNorm2d(5)))
        with self.assertRaises(syncnorm.ServiceError) as caught:
            snt.attach(other, self.client, job, 1, 2)
        text = str(caught.exception)
        self.assertEqual(caught.exception.code, "ALREADY_EXISTS")
        self.assertIn("layer 1 'bn2' has channels 3 there, 5 here", text)
        self.assertNotIn("delete it first", text)


if __name__ == "__main__":
    unittest.main()
