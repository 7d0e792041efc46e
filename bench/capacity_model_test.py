"""capacity_model against rows made from known constants (the fit must
recover them, and a row the model misses must fail --fit), and its sizing
against numbers worked out by hand here, not taken from the code."""

import contextlib
import io
import json
import math
import os
import tempfile
import unittest

import capacity_model as cm

# The benchmark's grid.
GRID = [(w, l, c, mode) for w in (8, 64, 256, 1024, 4096) for l in (1, 4)
        for c in (256, 2048) for mode in ("lockstep", "pipelined")]

# Known constants, per mode: CPU a, b, g, h; memory p, q, r, s, y, z;
# completion t0, kappa.
TRUE = {
    "lockstep": dict(a=18.0, b=0.011, g=2.5, h=2e-5, p=30000.0, q=70.0,
                     r=0.0, s=0.0, y=500.0, z=1e6, t0=0.08, kappa=0.9),
    "pipelined": dict(a=9.0, b=0.007, g=4.0, h=1e-5, p=32000.0, q=60.0,
                      r=15000.0, s=4.0, y=800.0, z=2e6, t0=0.2, kappa=1.1),
}


def synthetic_rows(noise=lambda i: 1.0):
    """wide_benchmark-shaped rows computed from TRUE by the formulas of
    docs/operations.md, written out here; `noise(i)` scales the i-th
    measured value."""
    rows = []
    i = 0
    for w, l, c, mode in GRID:
        t = TRUE[mode]
        k = l if mode == "pipelined" else 1  # in flight per rank
        cpu = t["a"] + t["b"] * c + t["g"] * math.log2(w) + t["h"] * w * c * k
        rss = (t["p"] + t["q"] * c + (k - 1) * (t["r"] + t["s"] * c)
               + t["y"] * c * l / w + t["z"] / w)
        completion = t["t0"] + t["kappa"] * w * (k + 1) / 2 * cpu / 1000
        rows.append({
            "server": "syncnorm", "W": w, "L": l, "C": c, "mode": mode,
            "server_cpu_us_per_contribution": cpu * noise(i),
            "rss_per_rank_bytes": rss * noise(i + 1),
            "completion_p50_ms": completion * noise(i + 2),
            "server_rss_base_bytes": 60e6,
            "request_bytes": 47 + 16 * c, "answer_bytes": 39 + 16 * c,
        })
        # The transport floor's rows are not fitted.
        rows.append({"server": "floor", "W": w, "L": l, "C": c, "mode": mode,
                     "server_cpu_us_per_contribution": 3.0,
                     "rss_per_rank_bytes": 1.0, "completion_p50_ms": 0.01,
                     "server_rss_base_bytes": 1.0, "request_bytes": 1,
                     "answer_bytes": 1})
        i += 3
    return rows


def hand_constants():
    """Round constants whose sizing is worked out by hand in the tests:
    12.5 us per contribution whatever W and C; memory 1000 + 10·C bytes
    per rank, 10·C more per further contribution in flight; completion
    0.4 ms + 1.25 x W x 12.5 us = 0.4 + W/64 ms."""
    mode = {"cpu_us": {"a": 12.5, "b": 0.0, "g": 0.0, "h": 0.0},
            "rss_rank": {"p": 1000.0, "q": 10.0, "r": 0.0, "s": 10.0,
                         "y": 0.0, "z": 0.0},
            "completion_ms": {"t0": 0.4, "kappa": 1.25}}
    return {"measured": "by hand", "lockstep": mode, "pipelined": dict(mode),
            "rss_base_bytes": 100e6,
            "request_bytes": {"m0": 0.0, "m1": 16.0},
            "answer_bytes": {"m0": 8.0, "m1": 8.0}}


class FitTest(unittest.TestCase):

    def test_recovers_the_constants(self):
        k = cm.fit(synthetic_rows())
        for mode, t in TRUE.items():
            fitted = dict(k[mode]["cpu_us"], **k[mode]["rss_rank"],
                          **k[mode]["completion_ms"])
            for name, value in t.items():
                if value == 0:
                    self.assertEqual(fitted[name], 0.0, msg="%s %s" % (mode, name))
                else:
                    self.assertAlmostEqual(fitted[name] / value, 1.0, places=6,
                                           msg="%s %s" % (mode, name))
        self.assertEqual(k["rss_base_bytes"], 60e6)
        self.assertAlmostEqual(k["request_bytes"]["m0"], 47.0, places=6)
        self.assertAlmostEqual(k["request_bytes"]["m1"], 16.0, places=9)
        self.assertAlmostEqual(k["answer_bytes"]["m0"], 39.0, places=6)

    def test_noise_within_the_tolerance_passes(self):
        # +-10% on every measured value, in a fixed pattern.
        rows = synthetic_rows(lambda i: (0.9, 1.1, 1.0, 1.05, 0.95)[i % 5])
        k = cm.fit(rows)
        self.assertEqual(cm.check(k, rows, io.StringIO()), [])

    def test_a_row_the_model_misses_fails_the_fit(self):
        rows = synthetic_rows()
        # One completion far from what the others say.
        victim = next(r for r in rows if r["server"] == "syncnorm" and r["W"] == 1024
                      and r["C"] == 2048 and r["L"] == 1 and r["mode"] == "lockstep")
        victim["completion_p50_ms"] *= 3
        k = cm.fit(rows)
        misses = cm.check(k, rows, io.StringIO())
        self.assertIn((1024, 1, 2048, "completion_ms"),
                      [(r["W"], r["L"], r["C"], q) for r, q, _ in misses])
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
            path = os.path.join(tmp, "rows.jsonl")
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(cm.main(["--fit", path]), 1)
                self.assertEqual(cm.main(["--predict", "8", "1", "256", "1"]), 0)

    def test_repeated_runs_are_checked_by_their_median(self):
        # The same configuration three times: 1x, 1x and 3x its
        # completion. The median (1x) is checked, so nothing misses.
        rows = synthetic_rows()
        twin = [dict(r) for r in rows]
        outlier = [dict(r) for r in rows]
        for r in outlier:
            r["completion_p50_ms"] *= 3
        k = cm.fit(rows)
        self.assertEqual(cm.check(k, rows + twin + outlier, io.StringIO()), [])

    def test_negative_terms_are_dropped(self):
        # cpu = 10 + 0.01 C - 5 log2 W: the log2 W term would come out
        # negative; it is dropped and no coefficient is negative.
        points = [(cm.point(w, c), 100 + 0.01 * c - 5 * math.log2(w))
                  for w in (64, 256, 1024, 4096) for c in (256, 2048)]
        k = cm.fit_terms("cpu_us", points)
        self.assertEqual(k["g"], 0.0)
        for v in k.values():
            self.assertGreaterEqual(v, 0.0)

    def test_one_channel_count_fits_what_it_determines(self):
        # Every row at C = 256: a and b cannot be told apart; still a fit.
        points = [(cm.point(w, 256), 20.0 + 3.0 * math.log2(w)) for w in (8, 64, 1024)]
        k = cm.fit_terms("cpu_us", points)
        for x, y in points:
            self.assertAlmostEqual(cm.evaluate("cpu_us", k, x) / y, 1.0, places=6)


class SizingTest(unittest.TestCase):
    """Constants of hand_constants(); every expected number below is
    worked out in its comment."""

    def setUp(self):
        self.k = hand_constants()

    def test_a_job_that_two_shards_carry(self):
        # N = 1000, L = 10, C = 100, S = 5.
        s = cm.size(self.k, 1000, 10, 100, 5)
        # 2 rounds (FORWARD, BACKWARD) x 1000 ranks x 10 layers x 5 steps/s.
        self.assertEqual(s["job_contributions_per_s"], 100000)
        # x 12.5 us = 1.25 cores; one layer 10,000/s = 0.125 cores.
        self.assertAlmostEqual(s["job_cores"], 1.25)
        self.assertAlmostEqual(s["layer"]["cores"], 0.125)
        # At 70% of one core a shard takes 5 layers (0.625), not 6 (0.75):
        # 10 layers need 2 shards of ceil(10/2) = 5 layers.
        self.assertEqual(s["shards_needed"], 2)
        self.assertEqual(s["layers_per_shard"], 5)
        self.assertAlmostEqual(s["shard"]["cores"], 0.625)
        self.assertEqual(s["shard_over"], [])
        # Memory, lockstep (one contribution in flight per rank): 100 MB +
        # 1000 ranks x (1000 + 10 x 100 + 5 layers x 256 of retry
        # window) = 103.28 MB.
        self.assertAlmostEqual(s["shard"]["memory_bytes"], 103.28e6)
        # A request: 16 x 100 = 1600 bytes + 14 of framing = 1614, in two
        # segments of 1448 (66 bytes of headers each): 1746 bytes; 50,000
        # a second on the shard x 8 bits.
        self.assertAlmostEqual(s["shard"]["in_bits_per_s"], 50000 * 8 * 1746)
        # An answer: 8 + 8 x 100 = 808 + 14 = 822, one segment: 888 bytes.
        self.assertAlmostEqual(s["shard"]["out_bits_per_s"], 50000 * 8 * 888)
        # Completion 0.4 + 1000/64 = 16.025 ms; 2 x 10 rounds a step.
        self.assertAlmostEqual(s["completion_ms"], 16.025)
        self.assertAlmostEqual(s["rounds_ms_per_step"], 320.5)
        self.assertAlmostEqual(s["step_ms"], 200.0)

    def test_one_layer_past_a_shard(self):
        # N = 10000, S = 3: one layer 2 x 10000 x 3 = 60,000/s x 12.5 us
        # = 0.75 cores, past 70% of a core: no shard count helps.
        s = cm.size(self.k, 10000, 4, 100, 3)
        self.assertAlmostEqual(s["layer"]["cores"], 0.75)
        self.assertIsNone(s["shards_needed"])
        self.assertEqual(s["over"], ["cpu"])

    def test_memory_limit(self):
        # C = 100000. Lockstep, 1500 ranks, one layer: 100 MB + 1500 x
        # (1000 + 10 x 100000 + 256) = 1,601,884,000 bytes, past 70% of
        # 2 GiB (1,503,238,553.6): no shard count helps.
        s = cm.size(self.k, 1500, 1, 100000, 0.001)
        self.assertAlmostEqual(s["layer"]["memory_bytes"], 1601884000)
        self.assertIsNone(s["shards_needed"])
        self.assertEqual(s["over"], ["memory"])
        # Pipelined, 1000 ranks, two layers on one shard (two in flight per
        # rank): 100 MB + 1000 x (1000 + 1e6 + 1 x 1e6 + 2 x 256)
        # = 2,101,512,000, over; one layer a shard: 1,101,256,000, fits.
        res = cm.Resources(mode="pipelined")
        s = cm.size(self.k, 1000, 2, 100000, 0.001, res=res)
        self.assertEqual(s["shards_needed"], 2)
        self.assertAlmostEqual(s["shard"]["memory_bytes"], 1101256000)
        self.assertAlmostEqual(cm.size(self.k, 1000, 2, 100000, 0.001, shards=1,
                                       res=res)["shard"]["memory_bytes"], 2101512000)

    def test_a_jobs_own_memory(self):
        # z = 5 MB of the job's own, y = 100 bytes per channel and layer:
        # 100 MB + 5 MB + 100 x 100 x 1 + 1000 x (1000 + 10 x 100 + 256)
        # = 107.266 MB.
        self.k["lockstep"] = dict(self.k["lockstep"], rss_rank={
            "p": 1000.0, "q": 10.0, "r": 0.0, "s": 0.0, "y": 100.0, "z": 5e6})
        s = cm.size(self.k, 1000, 1, 100, 5)
        self.assertAlmostEqual(s["layer"]["memory_bytes"], 107.266e6)

    def test_network_limit(self):
        # A 1 Gb/s NIC at 70%: one layer of 10 ranks at 1 step/s receives
        # 2 x 10 x 1 = 20 requests/s of 1,600,000 + 14 bytes in
        # ceil(1600014 / 1448) = 1105 segments:
        # (1600014 + 1105 x 66) x 8 x 20 = 267,671,040 b/s; two layers fit
        # (0.535 Gb/s), three do not (0.803 Gb/s).
        res = cm.Resources(nic_bits_per_s=1e9, memory_bytes=1e15)
        s = cm.size(self.k, 10, 3, 100000, 1, res=res)
        self.assertAlmostEqual(s["layer"]["in_bits_per_s"], 267671040)
        self.assertEqual(s["shards_needed"], 2)
        self.assertEqual(s["shard_over"], [])
        three = cm.shard_load(self.k, 10, 100000, 1, 3, res)
        self.assertEqual(cm.over(three, res), ["network"])

    def test_cpu_grows_with_the_round(self):
        # a + b·C + g·log2 W + h·W·C·K with a = 10, b = 0.01, g = 2,
        # h = 1e-5 at W = 1024, C = 2048: 10 + 20.48 + 20 + 20.97152.
        self.k["lockstep"]["cpu_us"] = {"a": 10.0, "b": 0.01, "g": 2.0, "h": 1e-5}
        self.assertAlmostEqual(cm.predict(self.k, "lockstep", "cpu_us", 1024, 2048),
                               71.45152)

    def test_limits(self):
        # L = 10, C = 100, S = 3.
        lim = cm.limits(self.k, 10, 100, 3)
        # CPU: 2 x 3 x W x 12.5e-6 = 7.5e-5 W > 0.7 from W > 9333.3.
        self.assertEqual(lim["cpu_w"], 9334)
        # Step: 2 x 10 x (0.4 + W/64) > 333.3 ms from W/64 > 16.267,
        # W > 1041.1.
        self.assertEqual(lim["step_w"], 1042)

    def test_relay(self):
        # N = 1024, t(W) = 0.4 + W/64 ms. Fan-in 32: one relay level, then
        # the shard's round of 32: 2 x t(32) = 1.8 ms. Fan-in 16: two
        # relay levels (64 + 4 relays), then the shard's round of 4:
        # 2 x t(16) + t(4) = 2 x 0.65 + 0.4625 = 1.7625 ms, the shortest
        # (fan-ins start at 8, the least W measured: fan-in 8:
        # 3 x t(8) + t(2) = 2.00625; 64: t(64) + t(16) = 2.15; direct:
        # t(1024) = 16.4).
        plan = cm.best_relay(self.k, 1024, 10, 100, 3)
        self.assertEqual((plan["fan_in"], plan["levels"], plan["relays"], plan["top"]),
                         (16, 3, 68, 4))
        self.assertAlmostEqual(plan["completion_ms"], 1.7625)
        self.assertAlmostEqual(cm.relayed(self.k, 1024, 10, 100, 3, 32)["completion_ms"], 1.8)
        # The shard's layer: 2 x 3 x 4 x 12.5 us = 0.0003 cores; a relay
        # serves 16 contributions of each of the 10 layers:
        # 2 x 3 x 16 x 10 x 12.5 us = 0.012 cores.
        self.assertAlmostEqual(plan["shard_layer"]["cores"], 0.0003)
        self.assertAlmostEqual(plan["relay"]["cores"], 0.012)
        self.assertEqual(plan["over"], [])
        # Relayed is faster once a tree beats t(W). One level of fan-in B
        # (B < W <= B^2): t(B) + t(ceil(W/B)) < t(W) is
        # B + ceil(W/B) + 25.6 < W. B = 8: W - ceil(W/8) > 33.6, first at
        # W = 39 (39 - 5 = 34; 38 - 5 = 33 is not). B = 16 needs
        # W - ceil(W/16) > 41.6 (W >= 45); deeper trees add a t0
        # (0.4 ms) a level and lose below W = 39: so W = 39.
        self.assertEqual(cm.limits(self.k, 10, 100, 3)["relay_faster_w"], 39)

    def test_a_relay_that_does_not_fit_is_passed_over(self):
        # N = 1024, S = 100, L = 10: a relay of fan-in 16 serves
        # 2 x 100 x 16 x 10 = 32,000/s = 0.4 cores, fits; fan-in 64
        # would be 1.6 cores. The shard with a round of 4 at fan-in 16:
        # 2 x 100 x 4 x 12.5 us = 0.01 cores. The fastest fitting is
        # still fan-in 16 (1.7625 ms).
        plan = cm.best_relay(self.k, 1024, 10, 100, 100)
        self.assertEqual(plan["fan_in"], 16)
        self.assertEqual(cm.relayed(self.k, 1024, 10, 100, 100, 64)["over"], ["cpu"])
        # At S = 300 every fan-in of 16 or more is over (1.2 cores at 16)
        # and fan-in 8, the least, fits (0.6): 3 x t(8) + t(2) = 2.00625 ms.
        plan = cm.best_relay(self.k, 1024, 10, 100, 300)
        self.assertEqual(plan["fan_in"], 8)
        self.assertAlmostEqual(plan["completion_ms"], 2.00625)


if __name__ == "__main__":
    unittest.main()
