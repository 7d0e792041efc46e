"""Client(relay=...): a rank's rounds go to its relay (docs/relay.md), every
other call to the aggregator; the rounds' answers match a float64 numpy
reference of the whole batch, and stop when the relay is gone."""

import threading
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

    def run_ranks(self, client, job, step, batches):
        """sync_forward of every rank from its own thread; the answers."""
        answers, errors = [None] * WORLD, []

        def rank(r):
            try:
                x = batches[r]
                m2 = ((x - x.mean(0)) ** 2).sum(0)
                group = client.node_group(job, r)
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

        # Without the relay, the rounds have nowhere to go.
        gone = harness.Relay(self.aggregator.address)
        lonely = syncnorm.Client(self.aggregator.address, rpc_timeout=10,
                                 round_timeout=1, relay=gone.address)
        gone.stop()
        with self.assertRaises(syncnorm.ServiceError):
            lonely.node_group(job, 0).sync_forward(
                0, 1, 2, np.zeros(CHANNELS), np.ones(CHANNELS))


if __name__ == "__main__":
    unittest.main()
