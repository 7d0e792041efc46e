"""Elastic membership through the Python API in one process against the
real aggregator: the server's refusals as ServiceError, a rank joined
beforehand (as by syncnormctl join) that attaches and starts at its join
step, a joiner whose first step the members have not reached (a clear
TimeoutError), and Session.leave."""

import threading
import unittest
import uuid

import torch
import torch.nn as nn

import harness
import syncnorm
import syncnorm.torch as snt


def job_name(tag):
    return "%s-%s" % (tag, uuid.uuid4().hex[:8])


def model():
    return snt.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(3)))


def train(session, net, steps, rank):
    """`steps` training forwards and backwards of `net` (rank's own data)."""
    for _ in range(steps):
        step = session.layers[0]._sn_step
        g = torch.Generator().manual_seed(100 * rank + step)
        net(torch.randn(4 + rank, 3, generator=g) * (1 + step)).sum().backward()


class ElasticApiTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.aggregator = harness.Aggregator()
        cls.client = syncnorm.Client(cls.aggregator.address, rpc_timeout=10,
                                     round_timeout=20)

    @classmethod
    def tearDownClass(cls):
        cls.aggregator.stop()

    def create(self, world_size, members):
        job = job_name("elastic")
        self.client.create_job(job, world_size,
                               [syncnorm.layer_spec("0", 3)],
                               members=members)
        return job

    def test_a_wide_job_answers_with_runs_and_reads_as_lists(self):
        # 65,536 ranks, every rank but 0 leaving and joining back: the
        # server sends the sets as runs only (past 65,536 listed ranks) and
        # the Python API gives rank lists as before (issue 32).
        world = 65536
        job = self.create(world, None)
        others = list(range(1, world))
        # Two steps: changes named for one step amend each other.
        info = self.client.update_membership(job, leave=others, step=1)
        self.assertEqual(info["membership"]["members"], [0])
        self.assertEqual(info["membership"]["history"][1]["left"], others)
        info = self.client.update_membership(job, join=others, step=2)
        got = self.client.get_job(job)
        self.assertEqual(got, info)
        m = got["membership"]
        self.assertEqual(m["version"], 2)
        self.assertEqual(m["members"], list(range(world)))
        self.assertEqual([c["members"] for c in m["history"]],
                         [list(range(world)), [0], list(range(world))])
        self.assertEqual(m["history"][2]["joined"], others)
        self.assertEqual(m["history"][2]["left"], [])
        self.assertFalse([k for c in m["history"] for k in c
                          if k.endswith("_runs")])
        self.assertEqual(syncnorm.member_since(got, 5),
                         m["history"][2]["step"])

    def test_hundreds_of_ranks_leave_one_by_one_at_one_step(self):
        # A Join at an epoch's end on a wide job: each rank that ran out
        # leaves on its own, at the same step, as syncnorm.torch's leave()
        # asks. The 64th was RESOURCE_EXHAUSTED (one kept change each).
        world = 256
        job = self.create(world, None)
        for rank in range(56, world):
            info = self.client.update_membership(job, step=1, leave=[rank])
            self.assertEqual(info["membership"]["version"], rank - 55)
        m = self.client.get_job(job)["membership"]
        self.assertEqual(m["members"], list(range(56)))
        self.assertEqual(len(m["history"]), 2)
        self.assertEqual(m["history"][1]["left"], list(range(56, world)))
        got = self.client.get_job(job)
        self.assertEqual(syncnorm.member_since(got, 0), 0)
        self.assertIsNone(syncnorm.member_since(got, 100))

    def test_refusals_are_service_errors_that_say_why(self):
        job = self.create(4, [0, 1])
        info = self.client.get_job(job)
        self.assertEqual(info["membership"]["members"], [0, 1])
        self.assertEqual(info["membership"]["version"], 0)
        cases = [
            (dict(join=[7]), "INVALID_ARGUMENT"),
            (dict(leave=[0, 1]), "INVALID_ARGUMENT"),  # no member left
        ]
        for kwargs, code in cases:
            with self.assertRaises(syncnorm.ServiceError,
                                   msg=str(kwargs)) as caught:
                self.client.update_membership(job, **kwargs)
            self.assertEqual(caught.exception.code, code, str(kwargs))
        changed = self.client.update_membership(job, step=3, join=[2])
        self.assertEqual(changed["membership"]["version"], 1)
        self.assertEqual(syncnorm.member_since(changed, 2), 3)
        with self.assertRaises(syncnorm.ServiceError) as caught:
            self.client.update_membership(job, step=2, leave=[0])
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")
        with self.assertRaises(syncnorm.ServiceError) as caught:
            self.client.update_membership("no-such-job", join=[1])
        self.assertEqual(caught.exception.code, "NOT_FOUND")

    def test_a_rank_joined_beforehand_starts_at_its_step(self):
        job = self.create(2, [0])
        net0 = model()
        s0 = snt.attach(net0, self.client, job, 0, 2, members=[0])
        self.assertFalse(s0.joined)
        self.assertEqual(s0.first_step, 0)
        train(s0, net0, 2, 0)
        self.client.update_membership(job, step=4, join=[1])
        # Rank 0 trains steps 2 and 3 alone while rank 1 attaches: it
        # waits for step 3 to be committed, then starts at 4.
        alone = threading.Thread(target=train, args=(s0, net0, 2, 0))
        alone.start()
        net1 = model()
        s1 = snt.attach(net1, self.client, job, 1, 2, members=[0])
        alone.join()
        self.assertFalse(s1.joined)
        self.assertEqual(s1.first_step, 4)
        self.assertEqual(s1.steps(), [4])
        bn0, bn1 = net0[0], net1[0]
        self.assertEqual(int(bn1.num_batches_tracked), 4)
        self.assertTrue(torch.equal(bn1.running_mean, bn0.running_mean))
        self.assertTrue(torch.equal(bn1.running_var, bn0.running_var))
        # Steps 4 and 5 together, then rank 1 leaves and rank 0 goes on.
        other = threading.Thread(target=train, args=(s1, net1, 2, 1))
        other.start()
        train(s0, net0, 2, 0)
        other.join()
        self.assertEqual(int(bn0.num_batches_tracked), 6)
        self.assertTrue(torch.equal(bn1.running_mean, bn0.running_mean))
        info = s1.leave()
        self.assertEqual(info["membership"]["members"], [0])
        self.assertEqual(info["membership"]["history"][-1]["step"], 6)
        self.assertEqual(info["membership"]["history"][-1]["left"], [1])
        with self.assertRaisesRegex(RuntimeError, "attach"):
            net1(torch.randn(4, 3))  # detached
        train(s0, net0, 1, 0)  # alone again, not waiting for rank 1
        self.assertEqual(int(bn0.num_batches_tracked), 7)

    def test_a_joiner_waits_for_the_steps_before_its_first_in_bounds(self):
        job = self.create(2, [0])
        self.client.update_membership(job, step=5, join=[1])
        with self.assertRaisesRegex(TimeoutError,
                                    "committed step -1 after 0.3 s; a rank "
                                    "joining at step 5 waits for step 4"):
            snt.attach(model(), self.client, job, 1, 2, members=[0],
                       join_timeout=0.3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
