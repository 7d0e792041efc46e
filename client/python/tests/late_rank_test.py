"""A rank that arrives long after the client's round timeout (issue: the
client hung at 100% CPU). Two worker processes, as a torch user runs
them: syncnorm.Client(address, round_timeout=1.5), a job whose
round_timeout_ms is 20 s, rank 1 five seconds late. Rank 0's forward must
fail with DEADLINE_EXCEEDED at about 1.5 s each time it is tried, and the
retry after rank 1 arrives must succeed on the same client; both steps'
outputs, input gradients and running statistics must equal
torch.nn.BatchNorm1d's in float64 on the concatenated batch."""

import os
import subprocess
import tempfile
import time
import unittest
import uuid

import torch
import torch.nn as nn

import harness
import late_rank_worker as worker

ROUND_TIMEOUT = 1.5
LATE = 5.0


class LateRankTest(unittest.TestCase):

    def test_client_round_timeout_fails_in_time_and_the_retry_works(self):
        out = tempfile.mkdtemp(prefix="late-", dir=os.environ.get(
            "TEST_TMPDIR"))
        with harness.Aggregator() as aggregator:
            job = "late-%s" % uuid.uuid4().hex[:8]
            procs = []
            for rank, delay in ((0, 0.0), (1, LATE)):
                cmd = [harness.PYTHON,
                       os.path.join(harness.HERE, "late_rank_worker.py"),
                       "--address=" + aggregator.address, "--job=" + job,
                       "--rank=%d" % rank, "--delay=%g" % delay,
                       "--round_timeout=%g" % ROUND_TIMEOUT,
                       "--round_timeout_ms=20000", "--give_up=30",
                       "--out=" + out]
                procs.append(subprocess.Popen(
                    cmd, env=harness.child_env(), stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT))
            failures = []
            deadline = time.monotonic() + 60
            for rank, p in enumerate(procs):
                try:
                    text, _ = p.communicate(
                        timeout=max(1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    text, _ = p.communicate()
                    failures.append("rank %d did not return within 60 s "
                                    "(the client hangs)" % rank)
                if p.returncode != 0:
                    failures.append("--- rank %d (exit %s) ---\n%s" % (
                        rank, p.returncode,
                        text.decode(errors="replace")[-4000:]))
            if failures:
                self.fail("\n".join(failures) + "\naggregator log:\n" +
                          open(aggregator.log_path).read()[-3000:])
        ranks = [torch.load(os.path.join(out, "rank%d.pt" % r))
                 for r in range(2)]

        # Rank 0: DEADLINE_EXCEEDED at about the client's round timeout
        # until rank 1 is there, then the result.
        attempts = ranks[0]["attempts"]
        failed = [a for a in attempts if a[0] != "OK"]
        self.assertGreaterEqual(len(failed), 2, attempts)
        for code, seconds, message in failed:
            self.assertEqual(code, "DEADLINE_EXCEEDED", message)
            self.assertIn("1.5s round timeout", message)
            self.assertGreaterEqual(seconds, ROUND_TIMEOUT - 0.05, attempts)
            self.assertLess(seconds, ROUND_TIMEOUT + 1.5, attempts)
        self.assertEqual([a[0] for a in attempts[len(failed):]],
                         ["OK"] * worker.STEPS, attempts)
        self.assertEqual([a[0] for a in ranks[1]["attempts"]],
                         ["OK"] * worker.STEPS, ranks[1]["attempts"])

        # torch on the concatenated batch, in float64.
        data = [worker.data(r) for r in range(2)]
        bn = nn.BatchNorm1d(worker.CHANNELS).double()
        for s in range(worker.STEPS):
            x = torch.cat([d[s][0] for d in data]).double().requires_grad_()
            dy = torch.cat([d[s][1] for d in data]).double()
            y = bn(x)
            (y * dy).sum().backward()
            lo = 0
            for r in range(2):
                hi = lo + data[r][s][0].shape[0]
                self.assertLess(harness.rel_error(ranks[r]["ys"][s],
                                                  y[lo:hi].detach()), 1e-5)
                self.assertLess(harness.rel_error(ranks[r]["dxs"][s],
                                                  x.grad[lo:hi]), 1e-5)
                lo = hi
        for r in range(2):
            self.assertLess(harness.rel_error(ranks[r]["running_mean"],
                                              bn.running_mean), 1e-6)
            self.assertLess(harness.rel_error(ranks[r]["running_var"],
                                              bn.running_var), 1e-6)
            self.assertEqual(ranks[r]["num_batches_tracked"], worker.STEPS)


if __name__ == "__main__":
    unittest.main()
