"""Client(relay=...): a rank's rounds go to its relay (docs/relay.md), every
other call to the aggregator; the rounds' answers match a float64 numpy
reference of the whole batch. When the relay is gone they go to the
aggregator (relay_fallback, the default) within a few connect timeouts,
with the answers of the same inputs sent directly; with relay_fallback=False
they stop."""

import threading
import time
import unittest
import uuid

import numpy as np

import harness
import syncnorm

WORLD = 8
CHANNELS = 3


class RelayApiTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.aggregator = harness.Aggregator()
        cls.relay = harness.Relay(cls.aggregator.address)

    @classmethod
    def tearDownClass(cls):
        cls.relay.stop()
        cls.aggregator.stop()

    def run_ranks(self, client, job, step, batches, groups=None):
        """sync_forward of every rank from its own thread (on `groups`, or
        a node group each of `client`); the answers."""
        answers, errors = [None] * WORLD, []

        def rank(r):
            try:
                x = batches[r]
                m2 = ((x - x.mean(0)) ** 2).sum(0)
                group = (groups[r] if groups is not None else
                         client.node_group(job, r))
                answers[r] = group.sync_forward(0, step, x.shape[0],
                                                x.mean(0), m2)
            except Exception as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(r,))
                   for r in range(WORLD)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return answers, errors

    def test_rounds_go_through_the_relay(self):
        client = syncnorm.Client(self.aggregator.address, rpc_timeout=10,
                                 round_timeout=3, relay=self.relay.address)
        self.assertEqual(client.relay, self.relay.address)
        self.assertIsNone(syncnorm.Client(self.aggregator.address).relay)
        job = "relay-%s" % uuid.uuid4().hex[:8]
        # Admin calls go to the aggregator: a relay refuses them.
        client.create_job(job, WORLD, [syncnorm.layer_spec("bn", CHANNELS)],
                          round_timeout_ms=2000)
        self.assertEqual(client.get_job(job)["world_size"], WORLD)
        rng = np.random.default_rng(35)
        batches = [rng.normal(1.0, 2.0, size=(2 + r % 3, CHANNELS))
                   for r in range(WORLD)]
        answers, errors = self.run_ranks(client, job, 0, batches)
        self.assertEqual(errors, [])
        whole = np.concatenate(batches)
        for count, mean, var, _, missing, _ in answers:
            self.assertEqual(count, whole.shape[0])
            np.testing.assert_allclose(mean, whole.mean(0), rtol=1e-12)
            np.testing.assert_allclose(var, whole.var(0), rtol=1e-12)
            self.assertEqual(tuple(missing), ())

    def test_rounds_fall_back_to_the_aggregator_when_the_relay_is_gone(self):
        gone = harness.Relay(self.aggregator.address)
        client = syncnorm.Client(self.aggregator.address, rpc_timeout=10,
                                 round_timeout=20, connect_timeout=0.5,
                                 relay=gone.address)
        self.assertTrue(client.relay_fallback)
        direct = syncnorm.Client(self.aggregator.address, rpc_timeout=10)
        job = "fallback-%s" % uuid.uuid4().hex[:8]
        reference = job + "-direct"
        for j in (job, reference):
            direct.create_job(j, WORLD, [syncnorm.layer_spec("bn", CHANNELS)],
                              round_timeout_ms=15000)
        groups = [client.node_group(job, r) for r in range(WORLD)]
        rng = np.random.default_rng(36)
        for step in range(3):
            batches = [rng.normal(-1.0, 3.0, size=(1 + r % 4, CHANNELS))
                       for r in range(WORLD)]
            if step == 1:
                gone.process.kill()  # SIGKILL, and no replacement
                gone.process.wait()
            start = time.monotonic()
            answers, errors = self.run_ranks(client, job, step, batches,
                                             groups)
            self.assertEqual(errors, [])
            # The relay's death costs about one connect timeout, not the
            # round timeout.
            self.assertLess(time.monotonic() - start, 5.0)
            expected, errors = self.run_ranks(direct, reference, step,
                                              batches)
            self.assertEqual(errors, [])
            whole = np.concatenate(batches)
            for got, want in zip(answers, expected):
                count, mean, var = got[:3]
                self.assertEqual(count, whole.shape[0])
                # Bit for bit the direct job's answer.
                np.testing.assert_array_equal(mean, want[1])
                np.testing.assert_array_equal(var, want[2])
                np.testing.assert_allclose(mean, whole.mean(0), rtol=1e-12)
                np.testing.assert_allclose(var, whole.var(0), rtol=1e-12)
        gone.stop()

    def test_without_fallback_the_rounds_wait_for_the_relay(self):
        gone = harness.Relay(self.aggregator.address)
        lonely = syncnorm.Client(self.aggregator.address, rpc_timeout=10,
                                 round_timeout=1, relay=gone.address,
                                 relay_fallback=False)
        self.assertFalse(lonely.relay_fallback)
        gone.stop()
        job = "nofallback-%s" % uuid.uuid4().hex[:8]
        lonely.create_job(job, 2, [syncnorm.layer_spec("bn", CHANNELS)],
                          round_timeout_ms=5000)
        start = time.monotonic()
        with self.assertRaisesRegex(syncnorm.ServiceError, "round timeout"):
            lonely.node_group(job, 0).sync_forward(
                0, 0, 2, np.zeros(CHANNELS), np.ones(CHANNELS))
        self.assertGreaterEqual(time.monotonic() - start, 1.0)


if __name__ == "__main__":
    unittest.main()
