"""The example, examples/train_cnn.py, launched as torch users launch jobs:
by torchrun and by torchrun's variables set for each process (env://); its
workers call attach(model) with no arguments. A few steps each; the run
must end with the buffers equal to the aggregator's statistics."""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

import harness

EXAMPLE = os.path.join(harness.HERE, "..", "examples", "train_cnn.py")


class ExampleTest(unittest.TestCase):

    def run_example(self, launcher, workers):
        env = harness.child_env()
        env["SYNCNORM_AGGREGATOR"] = harness.aggregator_binary()
        # The aggregator it starts keeps its state in a scratch directory
        # under TMPDIR, which must be gone when the example ends (torchrun
        # leaves its own torchelastic_* log directory there).
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.addCleanup(shutil.rmtree, tmp)
        env["TMPDIR"] = tmp
        p = subprocess.run(
            [harness.PYTHON, EXAMPLE, "--workers=%d" % workers, "--steps=4",
             "--log_every=2", "--launcher=" + launcher],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            timeout=240)
        out = p.stdout.decode(errors="replace")
        self.assertEqual(p.returncode, 0, out[-4000:])
        self.assertIn("%d workers, 7 BN layers synced through" % workers, out)
        done = re.search(r"done: 4 steps .* max \|diff\| ([0-9.e+-]+)", out)
        self.assertIsNotNone(done, out[-4000:])
        self.assertLessEqual(float(done.group(1)), 1e-6, done.group(0))
        self.assertEqual(
            [f for f in os.listdir(tmp) if not f.startswith("torchelastic_")],
            [], "left behind in TMPDIR")

    def test_torchrun(self):
        self.run_example("torchrun", 2)

    def test_env_variables(self):
        self.run_example("env", 3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
