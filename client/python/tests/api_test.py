"""syncnorm's Python API in one process against a real aggregator: errors,
eval without the service, state_dict interchange with torch BatchNorm,
convert_sync_batchnorm, in_channels=0, the client calls, checkpoints, round
deadlines, quorum rounds and in-process node groups (threads, which needs
the GIL released while a round waits)."""

import os
import threading
import unittest
import uuid

import torch
import torch.nn as nn
import torch.nn.functional as F

import harness
import syncnorm
import syncnorm.torch as snt
from syncnorm import _syncnorm


def job_name(tag):
    return "%s-%s" % (tag, uuid.uuid4().hex[:8])


class ApiTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.aggregator = harness.Aggregator()
        cls.client = syncnorm.Client(cls.aggregator.address, rpc_timeout=10,
                                     round_timeout=20)

    @classmethod
    def tearDownClass(cls):
        cls.aggregator.stop()

    # ---- errors say what was expected --------------------------------------

    def test_wrong_rank_raises_value_error(self):
        bn = snt.SyncBatchNorm(4).eval()
        for shape in [(4,), (2, 4, 1, 1, 1, 1)]:
            with self.assertRaisesRegex(ValueError, "expected 2-D to 5-D"):
                bn(torch.randn(shape))

    def test_wrong_channels_raises_value_error(self):
        bn = snt.SyncBatchNorm(4).eval()
        with self.assertRaisesRegex(ValueError,
                                    "expected input with 4 channels"):
            bn(torch.randn(2, 3, 5))
        last = snt.SyncBatchNorm(4, channel_last=True).eval()
        with self.assertRaisesRegex(ValueError, "last dimension"):
            last(torch.randn(2, 4, 5))

    def test_wrong_dtype_raises_type_error(self):
        bn = snt.SyncBatchNorm(4).eval()
        for dtype in (torch.float64, torch.int32):
            with self.assertRaisesRegex(
                    TypeError, "expected float32, float16 or bfloat16"):
                bn(torch.zeros(2, 4, dtype=dtype))
        with self.assertRaisesRegex(TypeError, "torch.Tensor"):
            bn([[1.0] * 4])

    def test_wrong_device_raises_runtime_error(self):
        bn = snt.SyncBatchNorm(4).eval()
        with self.assertRaisesRegex(RuntimeError,
                                    "expected input on cpu"):
            bn(torch.empty(2, 4, device="meta"))

    def test_wrong_residual_raises_value_error(self):
        bn = snt.SyncBatchNorm(4, fuse_relu=True).eval()
        with self.assertRaisesRegex(ValueError, "expected z with"):
            bn(torch.randn(2, 4), torch.randn(3, 4))

    def test_training_unattached_says_attach(self):
        bn = snt.SyncBatchNorm(4)
        with self.assertRaisesRegex(RuntimeError, "attach"):
            bn(torch.randn(2, 4))

    def test_extension_checks_layout_and_codes(self):
        x = torch.randn(2, 3, 4, 5).transpose(2, 3)
        desc = (x.data_ptr(), tuple(x.shape), tuple(x.stride()), 0, 0)
        with self.assertRaisesRegex(ValueError, "channels_last memory format"):
            _syncnorm.local_moments(desc)
        with self.assertRaisesRegex(TypeError, "dtype code"):
            _syncnorm.local_moments((x.data_ptr(), (2, 3), (3, 1), 7, 0))
        with self.assertRaisesRegex(ValueError, "2-D to 5-D"):
            _syncnorm.local_moments((x.data_ptr(), (6,), (1,), 0, 0))

    # ---- eval, state_dict, conversion ---------------------------------------

    def test_eval_is_plain_batch_norm_without_service(self):
        bn = snt.SyncBatchNorm(3, running_mean_initializer=[0.5, -1, 2],
                               running_variance_initializer=[2, 0.5, 1],
                               gamma_initializer=1.5, beta_initializer=0.25)
        bn.eval()
        x = torch.randn(4, 3, 6)
        want = F.batch_norm(x.double(), bn.running_mean.double(),
                            bn.running_var.double(),
                            bn.weight.double(), bn.bias.double(), False, 0.1,
                            1e-5)
        self.assertLess(harness.rel_error(bn(x), want), 1e-6)

    def test_state_dict_round_trip_with_torch_batchnorm2d(self):
        torch.manual_seed(0)
        ref = nn.BatchNorm2d(5)
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.normal_()
        for _ in range(3):
            ref(torch.randn(6, 5, 3, 3) * 2 + 1)
        ours = snt.SyncBatchNorm(5)
        ours.load_state_dict(ref.state_dict())
        self.assertEqual(list(ours.state_dict()), list(ref.state_dict()))
        x = torch.randn(4, 5, 3, 3)
        ref.eval()
        ours.eval()
        self.assertLess(harness.rel_error(ours(x), ref(x).double()), 1e-6)
        # ... and back, after training steps synced through a job.
        ours.train()
        attach = snt.attach(ours, self.client, job_name("roundtrip"), 0, 1)
        self.assertEqual(attach.layers, [ours])
        for _ in range(2):
            ours(torch.randn(6, 5, 3, 3)).sum().backward()
        back = nn.BatchNorm2d(5)
        back.load_state_dict(ours.state_dict())  # strict
        for key, value in ours.state_dict().items():
            self.assertTrue(torch.equal(back.state_dict()[key], value), key)
        # The job started from the loaded num_batches_tracked (3).
        self.assertEqual(int(back.num_batches_tracked), 5)

    def test_lazy_module_loads_torch_state_dict(self):
        ref = nn.BatchNorm1d(7)
        lazy = snt.SyncBatchNorm(in_channels=0)
        lazy.load_state_dict(ref.state_dict())
        self.assertEqual(lazy.num_features, 7)
        self.assertEqual(tuple(lazy.weight.shape), (7,))

    def test_convert_keeps_parameters_buffers_and_flags(self):
        model = nn.Sequential(
            nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4),
            nn.Sequential(nn.Flatten(), nn.Linear(4 * 2 * 2, 6),
                          nn.BatchNorm1d(6, momentum=None)),
            nn.Unflatten(1, (6, 1, 1, 1)), nn.BatchNorm3d(6, affine=False),
            nn.Flatten(), nn.SyncBatchNorm(6, eps=1e-3,
                                           track_running_stats=False))
        model[2][2].eval()
        before = {n: p for n, p in model.named_parameters()}
        buffers = {n: b for n, b in model.named_buffers()}
        converted = snt.convert_sync_batchnorm(model)
        self.assertIs(converted, model)
        bns = [m for m in model.modules() if isinstance(m, snt.SyncBatchNorm)]
        self.assertEqual(len(bns), 4)
        for name, p in converted.named_parameters():
            self.assertIs(p, before[name], name)
        for name, b in converted.named_buffers():
            self.assertIs(b, buffers[name], name)
        self.assertFalse(model[2][2].training)
        self.assertTrue(model[1].training)
        self.assertIsNone(model[2][2].momentum)
        self.assertEqual(model[2][2].momentum_mode, 3)
        self.assertFalse(model[4].affine)
        self.assertEqual(model[6].eps, 1e-3)
        self.assertIsNone(model[6].running_mean)
        one = snt.convert_sync_batchnorm(nn.BatchNorm2d(3), channel_last=True)
        self.assertIsInstance(one, snt.SyncBatchNorm)
        self.assertTrue(one.channel_last)
        self.assertIs(snt.SyncBatchNorm.convert_sync_batchnorm,
                      snt.convert_sync_batchnorm)

    def test_in_channels_zero_inferred_by_example_input(self):
        model = nn.Sequential(nn.Conv2d(2, 5, 1),
                              snt.SyncBatchNorm(in_channels=0),
                              nn.ReLU(),
                              snt.SyncBatchNorm(in_channels=0))
        optimizer_params = list(model[1].parameters())
        job = job_name("lazy")
        x = torch.randn(3, 2, 4, 4)
        snt.attach(model, self.client, job, 0, 1, example_input=x)
        self.assertEqual(model[1].num_features, 5)
        self.assertIs(list(model[1].parameters())[0], optimizer_params[0])
        self.assertTrue(model.training)
        model(x).sum().backward()
        info = self.client.get_job(job)
        self.assertEqual([l["num_features"] for l in info["layers"]], [5, 5])
        self.assertEqual(tuple(model[1].weight.grad.shape), (5,))

    def test_attach_without_channels_says_what_to_do(self):
        model = nn.Sequential(snt.SyncBatchNorm(in_channels=0))
        with self.assertRaisesRegex(ValueError, "example_input"):
            snt.attach(model, self.client, job_name("nolazy"), 0, 1)

    # ---- client, checkpoints, deadlines ------------------------------------

    def test_connect_timeout_reaches_the_client_and_is_checked(self):
        self.assertEqual(syncnorm.Client("127.0.0.1:1").connect_timeout, 5.0)
        client = syncnorm.Client("127.0.0.1:1", connect_timeout=1.5)
        self.assertEqual(client.connect_timeout, 1.5)
        for bad in (0, -1, float("nan")):
            with self.assertRaisesRegex(ValueError, "connect_timeout"):
                syncnorm.Client("127.0.0.1:1", connect_timeout=bad)

    def test_client_jobs(self):
        job = job_name("client")
        layers = [syncnorm.layer_spec("a", 3),
                  syncnorm.layer_spec("b", 2, "megengine", 0.9,
                                      initial_running_var=[2.0, 3.0])]
        info = self.client.create_job(job, 2, layers)
        self.assertEqual(info["world_size"], 2)
        self.assertEqual(info["committed_step"], -1)
        self.assertEqual(info["layers"][1]["momentum_mode"], "MOMENTUM_DECAY")
        self.assertEqual(self.client.create_job(job, 2, layers)["job_id"], job)
        with self.assertRaises(syncnorm.ServiceError) as e:
            self.client.create_job(job, 3, layers)
        self.assertEqual(e.exception.code, "ALREADY_EXISTS")
        stats = self.client.get_running_stats(job)
        self.assertEqual(stats["layers"][1]["running_var"], [2.0, 3.0])
        self.assertEqual(self.client.get_job(job)["layers"][0]["name"], "a")
        self.assertIn(job, [j["job_id"] for j in self.client.list_jobs()])
        seeded = self.client.set_running_stats(job, [{
            "layer": 0, "group": 0, "running_mean": [1.0, 2.0, 3.0],
            "running_var": [4.0, 5.0, 6.0], "num_batches_tracked": 7}])
        self.assertEqual(seeded["layers"][0]["num_batches_tracked"], 7)
        self.client.delete_job(job)
        with self.assertRaises(syncnorm.ServiceError) as e:
            self.client.get_job(job)
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertIsInstance(e.exception, RuntimeError)

    def test_missing_rank_fails_the_round_naming_it(self):
        model = nn.Sequential(snt.SyncBatchNorm(3))
        snt.attach(model, self.client, job_name("deadline"), 0, 2,
                   round_timeout_ms=300)
        with self.assertRaises(syncnorm.ServiceError) as e:
            model(torch.randn(4, 3))
        self.assertEqual(e.exception.code, "DEADLINE_EXCEEDED")
        self.assertIn("1", str(e.exception))

    def test_checkpoint_and_restore(self):
        model = nn.Sequential(snt.SyncBatchNorm(3), snt.SyncBatchNorm(3))
        job = job_name("ckpt")
        session = snt.attach(model, self.client, job, 0, 1)
        torch.manual_seed(1)
        model(torch.randn(5, 3)).sum().backward()
        model(torch.randn(5, 3)).sum().backward()
        try:
            session.checkpoint(tag="two")
        except syncnorm.ServiceError as e:
            if e.code == "UNIMPLEMENTED":
                self.skipTest("this aggregator has no checkpoints yet: %s"
                              % e)
            raise
        saved = [b.clone() for b in model.buffers()]
        self.assertEqual([c["step"] for c in
                          self.client.list_checkpoints(job)], [1])
        model(torch.randn(5, 3) + 4).sum().backward()
        session.restore(1)
        # The buffers mirror the service in float32, so equal to rounding.
        for b, want in zip(model.buffers(), saved):
            self.assertLess(harness.rel_error(b, want), 1e-6, (b, want))
        self.assertEqual(session.steps(), [2, 2])
        model(torch.randn(5, 3)).sum().backward()

    # ---- changes to an attached module --------------------------------------

    def test_ranks_that_change_buffers_differently_fail_loudly(self):
        """Rank 0 resets its running statistics, rank 1 does not: the
        round fails on both, saying so, and applies nothing."""
        job = job_name("disagree")
        models = [nn.Sequential(snt.SyncBatchNorm(3)) for _ in range(2)]
        for r, m in enumerate(models):
            snt.attach(m, self.client, job, r, 2, round_timeout_ms=20000)
        torch.manual_seed(6)
        xs = [torch.randn(4, 3), torch.randn(3, 3)]
        models[0][0].running_var.fill_(4.0)
        errors = [None, None]

        def run(r):
            try:
                models[r](xs[r])
            except syncnorm.ServiceError as e:
                errors[r] = e

        threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for e in errors:
            self.assertIsNotNone(e)
            self.assertEqual(e.code, "INVALID_ARGUMENT")
            self.assertEqual(e.reason, "RANKS_DISAGREE")
            self.assertIn("rank 1 sent a different momentum or "
                          "imported_stats than rank 0", str(e))
        stats = self.client.get_running_stats(job)["layers"][0]
        self.assertEqual(stats["num_batches_tracked"], 0)
        self.assertEqual(stats["running_var"], [1.0, 1.0, 1.0])

    def test_push_running_stats_sends_what_changed(self):
        model = nn.Sequential(snt.SyncBatchNorm(3), snt.SyncBatchNorm(3))
        job = job_name("push")
        session = snt.attach(model, self.client, job, 0, 1)
        model(torch.randn(5, 3)).sum().backward()
        self.assertEqual(session.push_running_stats(), 0)
        model.load_state_dict(nn.Sequential(nn.BatchNorm1d(3),
                                            nn.BatchNorm1d(3)).state_dict(),
                              strict=False)
        model[1].running_mean.fill_(0.25)
        self.assertEqual(session.push_running_stats(), 2)
        stats = self.client.get_running_stats(job)["layers"]
        self.assertEqual(stats[0]["num_batches_tracked"], 0)
        self.assertEqual(stats[1]["running_mean"], [0.25] * 3)
        self.assertEqual(session.push_running_stats(), 0)

    def test_frozen_layers_statistics_reach_the_service(self):
        """Layers that run no round (freeze, use_global_stats) of a
        pretrained model (num_batches_tracked 3): the aggregator holds
        their buffers from attach on, after training steps, and after a
        load_state_dict; a model attached again loads them. A
        training layer beside them still imports its counter with its
        first round. Outputs are torch's BatchNorm in float64 on the
        running statistics."""
        job = job_name("frozen")
        torch.manual_seed(9)
        model = nn.Sequential(
            snt.SyncBatchNorm(3, freeze=True),
            snt.SyncBatchNorm(3, use_global_stats=True),
            snt.SyncBatchNorm(3, momentum=None))

        def pretrain(seed, count):
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for bn in model:
                    bn.running_mean.copy_(torch.randn(3, generator=g))
                    bn.running_var.copy_(torch.rand(3, generator=g) + 0.5)
                    bn.num_batches_tracked.fill_(count)

        def service():
            return [(e["num_batches_tracked"], e["running_mean"],
                     e["running_var"])
                    for e in self.client.get_running_stats(job)["layers"]]

        def buffers(layers):
            return [(int(bn.num_batches_tracked),
                     bn.running_mean.double().tolist(),
                     bn.running_var.double().tolist()) for bn in layers]

        def check(want):
            # The training layer's buffers hold the float64 statistics in
            # float32; the frozen layers' are the very values sent.
            got = service()
            self.assertEqual(got[:2], want[:2])
            self.assertEqual(got[2][0], want[2][0])
            for a, b in zip(got[2][1:], want[2][1:]):
                self.assertLess(harness.rel_error(a, b), 1e-6)

        pretrain(1, 3)
        session = snt.attach(model, self.client, job, 0, 1)
        self.assertEqual(service()[:2], buffers(model[:2]))
        x = torch.randn(6, 3) * 2 + 1
        for _ in range(2):
            model(x).sum().backward()
        check(buffers(model))
        self.assertEqual([s[0] for s in service()], [3, 3, 5])
        frozen = model[0]
        want = F.batch_norm(x.double(), frozen.running_mean.double(),
                            frozen.running_var.double(),
                            frozen.weight.double(), frozen.bias.double(),
                            False, 0.0, frozen.eps)
        self.assertLess(harness.rel_error(frozen(x), want), 1e-6)
        pretrain(2, 11)  # say, load_state_dict of another checkpoint
        model[2].num_batches_tracked.fill_(5)  # its round imports the rest
        model(x).sum().backward()
        check(buffers(model))
        self.assertEqual([s[0] for s in service()], [11, 11, 6])
        # The service's copy restores the model: a fresh one attached again
        # loads it (a reloaded model resuming its job).
        saved = buffers(model)
        again = nn.Sequential(snt.SyncBatchNorm(3, freeze=True),
                              snt.SyncBatchNorm(3, use_global_stats=True),
                              snt.SyncBatchNorm(3, momentum=None))
        snt.attach(again, self.client, job, 0, 1)
        check(saved)
        check(buffers(again))

    def test_a_frozen_layer_does_not_hold_checkpoints_back(self):
        """A frozen layer (buffers as initialized: no import to send)
        beside a training one. The job's committed step follows the
        training layer (it stayed at -1: Session.checkpoint() asked for step
        -1 and a checkpoint of a trained step waited for ever); the
        checkpoint restores both layers; unfrozen, the layer runs the
        session's next step, as torch's BatchNorm in float64 would."""
        job = job_name("frozen-ckpt")
        torch.manual_seed(4)
        model = nn.Sequential(snt.SyncBatchNorm(3, freeze=True),
                              snt.SyncBatchNorm(3))
        session = snt.attach(model, self.client, job, 0, 1)
        x = torch.randn(6, 3) * 2 + 1
        for _ in range(3):
            model(x).sum().backward()
        self.assertEqual(self.client.get_job(job)["committed_step"], 2)
        self.assertEqual(session.checkpoint()["step"], 2)
        saved = [(bn.running_mean.clone(), bn.running_var.clone(),
                  int(bn.num_batches_tracked)) for bn in model]
        model(x).sum().backward()
        with torch.no_grad():
            model[0].running_mean.fill_(7)  # pushed at its next forward
        model(x)
        self.assertEqual(
            self.client.get_running_stats(job, layers=[0])["layers"][0]
            ["running_mean"], [7.0] * 3)
        session.restore(2)
        for bn, (mean, var, nbt) in zip(model, saved):
            self.assertTrue(torch.equal(bn.running_mean, mean))
            self.assertTrue(torch.equal(bn.running_var, var))
            self.assertEqual(int(bn.num_batches_tracked), nbt)
        stats = self.client.get_running_stats(job)["layers"]
        self.assertEqual([e["frozen"] for e in stats], [True, False])

        # Unfrozen: its first round is the session's step 3.
        model[0].freeze = False
        ref_mean = model[0].running_mean.double().clone()
        ref_var = model[0].running_var.double().clone()
        y0 = model[0](x)
        model[1](y0).sum().backward()
        want = F.batch_norm(x.double(), ref_mean, ref_var,
                            model[0].weight.double(), model[0].bias.double(),
                            True, 0.1, model[0].eps)
        self.assertLess(harness.rel_error(y0, want), 1e-6)
        self.assertEqual(model[0]._sn_step, 4)
        layer = self.client.get_running_stats(job, layers=[0])["layers"][0]
        self.assertFalse(layer["frozen"])
        self.assertEqual(layer["num_batches_tracked"], 1)
        for got, ref in ((layer["running_mean"], ref_mean),
                         (layer["running_var"], ref_var)):
            self.assertLess(harness.rel_error(torch.tensor(got), ref), 1e-6)
        self.assertEqual(self.client.get_job(job)["committed_step"], 3)

    def test_track_running_stats_changed_after_attach_is_refused(self):
        bn = snt.SyncBatchNorm(3)
        snt.attach(nn.Sequential(bn), self.client, job_name("track"), 0, 1)
        bn.track_running_stats = False
        with self.assertRaisesRegex(RuntimeError,
                                    "track_running_stats changed"):
            bn(torch.randn(4, 3))

    def test_a_stale_job_refuses_a_second_backward_saying_why(self):
        """A stale-synchronous job syncs one backward per forward: the
        second through one forward raises the service's INVALID_ARGUMENT
        naming staleness, after the first was answered."""
        bn = snt.SyncBatchNorm(3)
        snt.attach(nn.Sequential(bn), self.client, job_name("ssp2"), 0, 1,
                   staleness=1)
        x = torch.randn(4, 3, requires_grad=True)
        out = bn(x)
        out.sum().backward(retain_graph=True)
        self.assertIsNotNone(x.grad)
        with self.assertRaisesRegex(syncnorm.ServiceError,
                                    "INVALID_ARGUMENT.*stale-synchronous"):
            (out * out).sum().backward()

    def test_momentum_none_is_cumulative_and_back(self):
        bn = snt.SyncBatchNorm(3, momentum=None)
        self.assertEqual(bn.momentum_mode, 3)
        bn.momentum = 0.2
        self.assertEqual(bn.momentum_mode, 1)
        mx = snt.SyncBatchNorm(3, momentum=0.9, momentum_mode="mxnet")
        self.assertEqual(mx.momentum_mode, 2)
        mx.momentum_mode = "cumulative"
        self.assertIsNone(mx.momentum)

    def test_attach_needs_a_rank_job_and_address_or_says_where(self):
        model = nn.Sequential(snt.SyncBatchNorm(3))
        saved = dict(os.environ)
        try:
            for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                        "SYNCNORM_ADDRESS"):
                os.environ.pop(key, None)
            with self.assertRaisesRegex(ValueError, "RANK and WORLD_SIZE"):
                snt.attach(model, self.client, "j")
            os.environ.update(RANK="0", WORLD_SIZE="1")
            with self.assertRaisesRegex(ValueError, "TORCHELASTIC_RUN_ID"):
                snt.attach(model, self.client)
            os.environ["TORCHELASTIC_RUN_ID"] = job_name("env")
            with self.assertRaisesRegex(ValueError, "SYNCNORM_ADDRESS"):
                snt.attach(model)
            os.environ["SYNCNORM_ADDRESS"] = self.aggregator.address
            session = snt.attach(model)
            self.assertEqual((session.rank, session.world_size,
                              session.job_id),
                             (0, 1, os.environ["TORCHELASTIC_RUN_ID"]))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def test_stats_health_warns_of_a_shifted_rank(self):
        """Rank 2 of 3 (a model, this thread) feeds inputs shifted by five
        standard deviations; ranks 0 and 1 (threads sending the moments of
        normal batches) do not. Its session logs a warning naming it, and
        stats_health() lists the flag."""
        job = job_name("health")
        model = nn.Sequential(snt.SyncBatchNorm(4))
        session = snt.attach(model, self.client, job, 2, 3)
        session.health_interval = 1e-9  # poll at every step
        steps = 6
        errors = []

        def peer(rank):
            try:
                group = self.client.node_group(job, rank)
                g = torch.Generator().manual_seed(rank)
                for step in range(steps):
                    x = torch.randn(16, 4, generator=g).double()
                    mean = x.mean(0)
                    m2 = ((x - mean) ** 2).sum(0)
                    group.sync_forward(0, step, 16, mean.numpy(), m2.numpy())
            except Exception as e:  # surfaced below
                errors.append(e)

        peers = [threading.Thread(target=peer, args=(r,)) for r in (0, 1)]
        for t in peers:
            t.start()
        g = torch.Generator().manual_seed(2)
        with self.assertLogs("syncnorm", "WARNING") as logs:
            for _ in range(steps):
                model(torch.randn(16, 4, generator=g) + 5.0)
        for t in peers:
            t.join()
        self.assertEqual(errors, [])
        warned = [m for m in logs.output if "statistics health" in m]
        self.assertEqual(len(warned), 1, logs.output)
        self.assertIn("rank 2 of job %s, layer 0" % job, warned[0])
        self.assertIn("mean_shift", warned[0])
        health = session.stats_health()
        self.assertTrue(health["enabled"])
        self.assertEqual(health["flags_in_force"], 1)
        flag = health["flags"][0]
        self.assertEqual((flag["kind"], flag["rank"], flag["layer"]),
                         ("MEAN_SHIFT", 2, 0))
        self.assertEqual(flag["first_step"], 0)
        self.assertGreater(flag["score"], 5)

    def test_stats_health_off_is_part_of_the_spec(self):
        job = job_name("domains")
        snt.attach(nn.Sequential(snt.SyncBatchNorm(2)), self.client, job, 0,
                   1, stats_health=False)
        self.assertFalse(self.client.stats_health(job).get("enabled"))
        with self.assertRaisesRegex(syncnorm.ServiceError,
                                    "statistics health off there, on here"):
            snt.attach(nn.Sequential(snt.SyncBatchNorm(2)), self.client, job,
                       0, 1)

    def test_threads_of_one_process_as_one_node(self):
        """Two threads (local ranks) of one contributor: each blocks in a
        round until the other arrives, so the GIL must be free meanwhile."""
        job = job_name("threads")
        node = self.client.thread_node(job, 0, 2, timeout=20)
        torch.manual_seed(2)
        x = torch.randn(7, 4, 3) * 3 + 1
        shards = [x[:3], x[3:]]
        outs = [None, None]
        errors = []
        models = [nn.Sequential(snt.SyncBatchNorm(4)) for _ in range(2)]
        for i, m in enumerate(models):
            snt.attach(m, self.client, job, 0, 1, node_group=node.member(i))

        def run(i):
            try:
                outs[i] = models[i](shards[i]).detach()
            except Exception as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertFalse(errors, errors)
        want = F.batch_norm(x.double(), None, None, training=True)
        self.assertLess(harness.rel_error(torch.cat(outs), want), 1e-6)

    def test_quorum_round_names_the_absent_rank(self):
        """A job of 3 ranks whose rounds complete with 2: rank 0 is a node
        of two threads, rank 1 a worker alone, rank 2 absent at step 0.
        Every worker present reads (2,) and normalized with the batch of
        ranks 0 and 1 only; at step 1 rank 2 joins and all read ()."""
        job = job_name("quorum")
        quorum = {"min_ranks": 2, "grace_ms": 2000}
        node = self.client.thread_node(job, 0, 2, timeout=20)
        groups = [node.member(0), node.member(1),
                  self.client.node_group(job, 1), None]
        ranks = [0, 0, 1, 2]
        models = [nn.Sequential(snt.SyncBatchNorm(3)) for _ in ranks]
        torch.manual_seed(5)
        xs = [torch.randn(n, 3, 2) * 2 + 1 for n in (3, 2, 4, 3)]
        for i in range(3):
            snt.attach(models[i], self.client, job, ranks[i], 3,
                       node_group=groups[i], quorum=quorum,
                       round_timeout_ms=20000)
        self.assertEqual(models[0][0].last_missing_ranks, ())
        self.assertEqual(self.client.get_job(job)["quorum"],
                         {"min_ranks": 2, "grace_ms": 2000})

        def step(workers):
            outs, errors = {}, []

            def run(i):
                try:
                    outs[i] = models[i](xs[i]).detach()
                except Exception as e:  # surfaced below
                    errors.append(e)

            threads = [threading.Thread(target=run, args=(i,))
                       for i in workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            self.assertFalse(errors, errors)
            want = F.batch_norm(torch.cat([xs[i] for i in workers]).double(),
                                None, None, training=True)
            got = torch.cat([outs[i] for i in workers])
            self.assertLess(harness.rel_error(got, want), 1e-5)

        step([0, 1, 2])
        for i in range(3):
            self.assertEqual(models[i][0].last_missing_ranks, (2,), i)
        # Rank 2 comes back: attach resumes at the committed step + 1.
        snt.attach(models[3], self.client, job, 2, 3, quorum=quorum,
                   round_timeout_ms=20000)
        step([0, 1, 2, 3])
        for i in range(4):
            self.assertEqual(models[i][0].last_missing_ranks, (), i)
        self.assertEqual(self.client.get_job(job)["committed_step"], 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
