"""syncnorm.torch.SyncBatchNorm as a drop-in for torch.nn.SyncBatchNorm:
W = 4 worker processes that run torch.distributed (gloo, env://) do what
torch users do (process groups of any ranks, momentum changed after the
model is built, torch.optim.swa_utils.update_bn, reset_running_stats,
load_state_dict and writes to the buffers, a DDP model saved and reloaded
mid-training, a layer called twice per step, MegEngine's freeze and
MXNet's use_global_stats, a batch of one value per channel, attach() with
torch's launch variables), against one real aggregator; this process
checks each against torch's BatchNorm in float64 on the concatenated batch
of the group (or the framework's documented behaviour). Relative errors
at most 1e-5; the buffers and the aggregator's statistics both."""

import os
import sys
import tempfile
import time
import unittest
import uuid

import torch

import drop_in
import harness

TOLERANCE = 1e-5


class DropInTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        start = time.time()
        cls.aggregator = harness.Aggregator(["--round_timeout_ms=20000"])
        cls.out = tempfile.mkdtemp(prefix="drop-in-",
                                   dir=os.environ.get("TEST_TMPDIR"))
        cls.run_id = "drop-in-" + uuid.uuid4().hex[:8]
        procs = harness.launch_gloo_workers(
            "drop_in_worker.py", drop_in.WORLD_SIZE,
            ["--run_id=" + cls.run_id, "--out=" + cls.out],
            {"TORCHELASTIC_RUN_ID": cls.run_id + "-launch",
             "SYNCNORM_ADDRESS": cls.aggregator.address})
        failures = harness.wait_workers(procs, timeout=400)
        cls.aggregator.stop()
        if failures:
            raise RuntimeError("workers failed:\n" + "\n".join(failures))
        cls.records = [torch.load(os.path.join(cls.out, "rank%d.pt" % r))
                       for r in range(drop_in.WORLD_SIZE)]
        cls.seconds = time.time() - start
        cls.table = []

    @classmethod
    def tearDownClass(cls):
        lines = ["", "worst relative error per scenario (%d workers, %.1f s):"
                 % (drop_in.WORLD_SIZE, cls.seconds)]
        for name, worst in cls.table:
            lines.append("  %-28s %.2e" % (name, worst))
        sys.stderr.write("\n".join(lines) + "\n")

    def scenario(self, name):
        return [r[name] for r in self.records]

    def check(self, name, errors):
        worst = max(errors.worst.values(), default=0.0)
        self.table.append((name, worst))
        bad = {k: v for k, v in errors.worst.items() if not v <= TOLERANCE}
        self.assertFalse(bad or errors.problems,
                         "relative errors above %g: %s\n%s" % (
                             TOLERANCE, bad, "\n".join(errors.problems)))

    # 1. process_group membership
    def test_process_groups_0_2_and_1_3(self):
        self.check("groups [0,2] [1,3]", drop_in.check_groups(
            self.scenario("groups_0_2_and_1_3"), [[0, 2], [1, 3]], 31))

    def test_process_groups_of_uneven_size(self):
        self.check("groups [0,1,3] [2]", drop_in.check_groups(
            self.scenario("groups_0_1_3_and_2"), [[0, 1, 3], [2]], 32))

    # 2. changes to the module after attach
    def test_momentum_read_at_every_forward(self):
        self.check("momentum", drop_in.check_momentum(
            self.scenario("momentum")))

    def test_swa_update_bn(self):
        self.check("update_bn", drop_in.check_update_bn(
            self.scenario("update_bn")))

    def test_reset_load_state_dict_and_buffer_writes(self):
        self.check("buffers", drop_in.check_buffers(self.scenario("buffers")))

    # 3. a DDP model saved after step 2, reloaded and attached again
    def test_reloaded_model_resumes_its_job(self):
        self.check("reload", drop_in.check_reload(self.scenario("reload")))

    # 4. one layer called twice per step
    def test_layer_called_twice_backwards_in_any_order(self):
        self.check("twice", drop_in.check_twice(self.scenario("twice")))

    # 5. MegEngine freeze, MXNet use_global_stats
    def test_megengine_freeze_freezes_gamma_and_beta(self):
        self.check("freeze", drop_in.check_frozen(
            self.scenario("freeze"), "freeze"))

    def test_mxnet_use_global_stats_lets_them_learn(self):
        self.check("use_global_stats", drop_in.check_frozen(
            self.scenario("use_global_stats"), "use_global_stats"))

    # 6. a global count of one value per channel
    def test_single_value_per_channel_is_torchs_value_error(self):
        self.check("single value", drop_in.check_single_value(
            self.scenario("single_value")))

    # 7. torch.distributed conventions
    def test_attach_takes_torchs_launch_variables(self):
        self.check("launch", drop_in.check_launch(
            self.scenario("launch"), self.run_id,
            self.aggregator.address))


if __name__ == "__main__":
    unittest.main(verbosity=2)
