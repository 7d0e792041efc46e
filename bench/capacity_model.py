#!/usr/bin/env python3
"""The aggregator's capacity model (issue 35): what one shard needs for a
synchronous job of N ranks, L BatchNorm layers of C channels at S training
steps a second, how many shards spread the job, and when one layer's round
is more than one shard can serve (what a relay tier would address).

The formulas are in docs/operations.md, "Capacity"; the relay tier in
docs/relay.md. The constants are wide_benchmark's measurements, fitted
here:

  capacity_model.py --fit ROWS.jsonl [--markdown]
      fit the constants, print them and, for every syncnorm row,
      predicted against measured; exit 1 if any misses by more than
      TOLERANCE
  capacity_model.py --predict N L C S [--shards n]
      the sizing, with CONSTANTS below (or with those of --fit)

Per step every rank sends each layer one FORWARD and one BACKWARD
contribution, each its own round, so a layer takes 2·S rounds a second of
N contributions each. A round of one layer is served by the one shard that
owns the layer: its N contributions cannot be split across shards.

Pure Python 3 standard library; capacity_model_test.py imports it.
"""

import argparse
import collections
import json
import math
import statistics
import sys

# A prediction that misses its measurement by more than this (relative) is
# a miss: --fit exits 1. The benchmark's machine is a shared 2-core VM
# whose speed swings about 2x within an hour (bench/RESULTS.md).
TOLERANCE = 0.35

# ---- The formulas --------------------------------------------------------
#
# Each fitted quantity is a sum of coefficient x term, each term a
# function of a Point: W (contributions a round), C (channels), K
# (contributions in flight per rank: 1 in lockstep, as a training step
# sends; L pipelined), L (the job's layers on the server) and cpu (the
# model's CPU per contribution there, for the completion).
#
#   cpu_us        = a + b·C + g·log2(W) + h·W·C·K     server CPU per contribution
#   rss_rank      = p + q·C + (K-1)·(r + s·C)        server memory per rank
#                   + y·C·L/W + z/W
#   completion_ms = t0 + kappa·W·(K+1)/2·cpu_us/1000  last contribution sent -> last answer
#   request_bytes = m0 + m1·C                        one Contribution, serialized
#   answer_bytes  = m0 + m1·C                        one RoundResult, serialized
#
# CPU: a + b·C is a contribution's own work (gRPC's transport above all:
# the floor server costs about as much). It grows with W twice over: by g
# per doubling of the connections, and by h with the round's working set,
# W·K payloads of C channels (past the caches, the allocator hands pages
# back and takes them again: minor faults per contribution climb from
# ~0 to ~4-11 at W·C·K of 8M-34M). A round's own work (log record,
# running statistics, health) shared by its W contributions is below the
# noise: a term in 1/W improves no prediction, so there is none.
# Memory: p + q·C is a rank's connection and stream with one contribution
# in flight, r + s·C each further one, y·C per channel of each of the
# job's layers (the retry window's results, the store's buffers), z the
# rest of the job; the benchmark measures RSS per rank as (RSS after the
# rounds - RSS before) / W, what the server keeps rather than its peak.
# Completion: the W contributions of a round arrive together and one RPC
# thread does their work one after another, so a round completes about
# W·cpu after its last contribution is sent; with K rounds in flight per
# rank the median one also waits for half of those ahead of it.

Point = collections.namedtuple("Point", "W C K L cpu")


def point(w, c, k=1, l=1, cpu=0.0):
    return Point(float(w), float(c), float(k), float(l), float(cpu))


TERMS = {
    "cpu_us": (("a", lambda x: 1.0), ("b", lambda x: x.C),
               ("g", lambda x: math.log2(x.W)), ("h", lambda x: x.W * x.C * x.K)),
    "rss_rank": (("p", lambda x: 1.0), ("q", lambda x: x.C),
                 ("r", lambda x: x.K - 1), ("s", lambda x: x.C * (x.K - 1)),
                 ("y", lambda x: x.C * x.L / x.W), ("z", lambda x: 1.0 / x.W)),
    "completion_ms": (("t0", lambda x: 1.0),
                      ("kappa", lambda x: x.W * (x.K + 1) / 2 * x.cpu / 1000)),
    "bytes": (("m0", lambda x: 1.0), ("m1", lambda x: x.C)),
}

# The constants, per mode where they depend on how clients send (lockstep:
# a rank sends a layer's contribution after the answer to the one before,
# as a training step does; pipelined: a step's L layers at once). Fitted
# by --fit from bench/wide_benchmark.py's run of 2026-12-07 (80 rows,
# durable aggregator, W = 8..4096, L = 1 and 4, C = 256 and 2048).
CONSTANTS = {
    "measured": "wide_benchmark, 2026-12-07, 40 syncnorm rows, commit f5e14aa",
    "lockstep": {
        "cpu_us": {"a": 8.588, "b": 0.01216, "g": 5.674, "h": 1.587e-06},
        "rss_rank": {"p": 33040.0, "q": 54.93, "r": 0.0, "s": 0.0, "y": 620.3,
                     "z": 1117000.0},
        "completion_ms": {"t0": 0.05266, "kappa": 0.9562},
    },
    "pipelined": {
        "cpu_us": {"a": 4.5, "b": 0.01199, "g": 5.869, "h": 3.078e-06},
        "rss_rank": {"p": 32490.0, "q": 53.44, "r": 13110.0, "s": 16.0, "y": 807.4,
                     "z": 1131000.0},
        "completion_ms": {"t0": 0.007511, "kappa": 1.03},
    },
    "rss_base_bytes": 97329152.0,
    "request_bytes": {"m0": 36.61, "m1": 16.0},
    "answer_bytes": {"m0": 36.31, "m1": 16.0},
    # A relay's CPU per contribution against a shard's at the same number
    # of connections: the relays of wide_benchmark --relays 8 (W = 1024 and
    # 4096, C = 2048, commit 89e971b) took 176-325 us a contribution, 2.2-3x
    # a shard at their width (the relay serves its ranks on gRPC's callback
    # API, which hands each message between threads; the shard runs one
    # completion-queue thread). Not fitted from the direct rows: carried
    # over by --fit.
    "relay_cpu_factor": 3.0,
}



def evaluate(kind, coefficients, x):
    """The value of quantity `kind` (a key of TERMS) at Point x."""
    return sum(coefficients.get(name, 0.0) * term(x) for name, term in TERMS[kind])


def in_flight(mode, layers):
    """Contributions in flight per rank: 1 in lockstep, L pipelined."""
    return layers if mode == "pipelined" else 1


def predict(constants, mode, kind, w, c, k=1, l=1):
    """Quantity `kind` of `mode` (cpu_us, rss_rank, completion_ms) at W = w,
    C = c, K = k in flight per rank and L = l layers."""
    m = constants[mode]
    x = point(w, c, k, l)
    if kind == "cpu_us":
        return evaluate(kind, m[kind], x)
    return evaluate(kind, m[kind], x._replace(cpu=evaluate("cpu_us", m["cpu_us"], x)))


# ---- Fitting -------------------------------------------------------------


class _Dependent(ValueError):
    """A column of the system is a combination of those before it."""

    def __init__(self, column):
        super().__init__("column %d is dependent" % column)
        self.column = column


def _solve(matrix, vector):
    """x with matrix·x = vector (a symmetric matrix of columns scaled to
    unit size), by Gaussian elimination with partial pivoting; raises
    _Dependent naming the first column that the others already determine."""
    n = len(vector)
    m = [list(row) + [v] for row, v in zip(matrix, vector)]
    largest = max(abs(m[i][i]) for i in range(n))
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-9 * largest:
            raise _Dependent(col)
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= factor * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def fit_terms(kind, points):
    """Coefficients of quantity `kind` from [(Point, value)], by least
    squares on the relative error: minimizes sum ((model - value)/value)^2,
    so that small and large values weigh alike, as the tolerance does.
    A coefficient that comes out negative has its term dropped and the
    others refitted (each time the most negative), so that no prediction
    turns negative when extrapolated; a term the points cannot tell from
    the others (C at one value: C is then a multiple of 1) is dropped too.
    Returns {name: coefficient}. REQUIRES: values > 0."""
    names = [name for name, _ in TERMS[kind]]
    terms = dict(TERMS[kind])
    active = list(names)
    while active:
        rows = [[terms[n](x) / y for n in active] for x, y in points]
        # Columns scaled to unit size, so C (thousands) and W·C (millions)
        # do not make the normal equations ill-conditioned.
        scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(len(active))]
        rows = [[r[j] / scale[j] for j in range(len(active))] for r in rows]
        ata = [[sum(r[i] * r[j] for r in rows) for j in range(len(active))]
               for i in range(len(active))]
        atb = [sum(r[i] for r in rows) for i in range(len(active))]
        try:
            x = [v / s for v, s in zip(_solve(ata, atb), scale)]
        except _Dependent as e:
            del active[e.column]
            continue
        negative = [(v, n) for v, n in zip(x, active) if v < 0]
        if not negative:
            fitted = dict(zip(active, x))
            return {n: fitted.get(n, 0.0) for n in names}
        active.remove(min(negative)[1])
    return {n: 0.0 for n in names}


# What each fitted quantity is measured as: the row's key.
MEASURED = {
    "cpu_us": "server_cpu_us_per_contribution",
    "rss_rank": "rss_per_rank_bytes",
    "completion_ms": "completion_p50_ms",
}


def row_point(row, cpu=0.0):
    return point(row["W"], row["C"], in_flight(row["mode"], row["L"]), row["L"], cpu)


def _points(rows, key, cpu=None):
    """[(Point, value)] of the rows that have a positive `key`; with `cpu`
    (cpu_us coefficients) each Point carries the model's CPU there."""
    out = []
    for r in rows:
        if (r.get(key) or 0) <= 0:
            continue
        x = row_point(r)
        if cpu is not None:
            x = x._replace(cpu=evaluate("cpu_us", cpu, x))
        out.append((x, float(r[key])))
    return out


def fit(rows):
    """The constants, fitted from benchmark rows (dicts with
    wide_benchmark's keys); only the syncnorm server's rows count, each
    mode's on their own (the completion after the CPU, which it uses).
    Returns a dict shaped like CONSTANTS."""
    ours = [r for r in rows if r.get("server") == "syncnorm"]
    if not ours:
        raise ValueError("no rows of the syncnorm server")
    out = {"measured": "fitted from %d syncnorm rows" % len(ours)}
    for mode in sorted({r["mode"] for r in ours}):
        mine = [r for r in ours if r["mode"] == mode]
        cpu = fit_terms("cpu_us", _points(mine, MEASURED["cpu_us"]))
        out[mode] = {
            "cpu_us": cpu,
            "rss_rank": fit_terms("rss_rank", _points(mine, MEASURED["rss_rank"])),
            "completion_ms": fit_terms("completion_ms",
                                       _points(mine, MEASURED["completion_ms"], cpu)),
        }
    out["rss_base_bytes"] = statistics.median(
        r["server_rss_base_bytes"] for r in ours if r.get("server_rss_base_bytes"))
    out["request_bytes"] = fit_terms("bytes", _points(ours, "request_bytes"))
    out["answer_bytes"] = fit_terms("bytes", _points(ours, "answer_bytes"))
    out["relay_cpu_factor"] = CONSTANTS["relay_cpu_factor"]
    return out


# ---- Checking the fit against the rows -----------------------------------


def merged(rows):
    """The rows with one row per (server, W, L, C, mode): several runs
    appended to one file are checked by the median of each value."""
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault((r.get("server"), r["W"], r["L"], r["C"], r["mode"]), []).append(r)
    out = []
    for group in groups.values():
        row = dict(group[0])
        for key in MEASURED.values():
            values = [r[key] for r in group if r.get(key) is not None]
            if values:
                row[key] = statistics.median(values)
        out.append(row)
    return out


def predictions(constants, row):
    """[(quantity, predicted, measured)] for one syncnorm row; measured
    None where the row has no value."""
    k = in_flight(row["mode"], row["L"])
    return [(kind, predict(constants, row["mode"], kind, row["W"], row["C"], k, row["L"]),
             row.get(key)) for kind, key in MEASURED.items()]


def check(constants, rows, out=None, markdown=False):
    """Prints predicted against measured for every syncnorm configuration
    (the median of its rows; with the transport floor's CPU of the same
    shape, where the rows have it; as a Markdown table with `markdown`)
    and returns the misses: [(row, quantity, relative error)]."""
    out = out or sys.stdout
    rows = merged(rows)
    floor = {(r["W"], r["L"], r["C"], r["mode"]): r for r in rows
             if r.get("server") == "floor"}
    header = ("mode", "W", "L", "C", "CPU µs/contribution", "measured", "error",
              "floor's CPU", "RSS/rank", "measured", "error",
              "completion ms", "measured", "error")
    lines = [header]
    misses = []
    for r in sorted((r for r in rows if r.get("server") == "syncnorm"),
                    key=lambda r: (r["mode"], r["L"], r["C"], r["W"])):
        cells = [r["mode"], str(r["W"]), str(r["L"]), str(r["C"])]
        for quantity, pred, meas in predictions(constants, r):
            if meas is None or meas <= 0:
                cells += [_num(pred), "-", "-"]
            else:
                err = (pred - meas) / meas
                if abs(err) > TOLERANCE:
                    misses.append((r, quantity, err))
                cells += [_num(pred), _num(meas), "%+.0f%%" % (100 * err)]
            if quantity == "cpu_us":
                f = floor.get((r["W"], r["L"], r["C"], r["mode"]))
                cells.append(_num(f["server_cpu_us_per_contribution"]) if f else "-")
        lines.append(tuple(cells))
    _table(lines, out, markdown)
    return misses


def _num(x):
    if x >= 1000:
        return "{:,.0f}".format(x)
    if x >= 10:
        return "%.1f" % x
    return "%.3g" % x


def _table(lines, out, markdown=False):
    if markdown:
        for i, line in enumerate(lines):
            out.write("| " + " | ".join(line) + " |\n")
            if i == 0:
                out.write("|" + "---|" * len(line) + "\n")
        return
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        out.write("  ".join(s.rjust(w) for s, w in zip(line, widths)).rstrip() + "\n")


# ---- Sizing --------------------------------------------------------------

# gRPC's message prefix (5 bytes) and an HTTP/2 DATA frame header (9).
FRAMING_BYTES = 14
# TCP (with timestamps) + IPv4 + Ethernet headers per segment of MSS bytes.
SEGMENT_HEADER_BYTES = 32 + 20 + 14
MSS = 1448
# The retry window: an 8-byte fingerprint (and its bookkeeping, 16 bytes)
# per rank for each of the 8 recent rounds of a layer, per phase
# (docs/operations.md, Limits). The benchmark sends FORWARD only and its
# RSS cannot resolve it; added to the fitted memory.
RETRY_WINDOW_BYTES_PER_RANK_LAYER = 16 * 8 * 2


def wire_bytes(message_bytes):
    """Bytes on the wire for one gRPC message of `message_bytes`."""
    payload = message_bytes + FRAMING_BYTES
    return payload + SEGMENT_HEADER_BYTES * math.ceil(payload / MSS)


class Resources:
    """What one shard has. Defaults: the RPC thread's one core (a shard's
    round work runs on one thread, docs/operations.md), deploy/base's 2 GiB
    memory limit, a 10 Gb/s NIC, and planning for 70% of each (rendezvous
    hashing spreads layers unevenly, and rounds come in bursts)."""

    def __init__(self, cores=1.0, memory_bytes=2 * 2**30, nic_bits_per_s=10e9,
                 utilization=0.7, mode="lockstep"):
        self.cores = cores
        self.memory_bytes = memory_bytes
        self.nic_bits_per_s = nic_bits_per_s
        self.utilization = utilization
        self.mode = mode


def shard_load(constants, ranks, channels, steps_per_s, layers_on_shard, res):
    """What a server needs for `layers_on_shard` layers of one job, each
    round of `ranks` contributions: a dict of contributions_per_s, cpu_us
    (per contribution), cores, memory_bytes (the base included),
    in_bits_per_s and out_bits_per_s."""
    k = in_flight(res.mode, layers_on_shard)
    # A FORWARD and a BACKWARD round a step and layer.
    rate = 2.0 * ranks * steps_per_s * layers_on_shard
    cpu_us = predict(constants, res.mode, "cpu_us", ranks, channels, k, layers_on_shard)
    per_rank = (predict(constants, res.mode, "rss_rank", ranks, channels, k, layers_on_shard)
                + layers_on_shard * RETRY_WINDOW_BYTES_PER_RANK_LAYER)
    x = point(ranks, channels)
    return {
        "contributions_per_s": rate,
        "cpu_us": cpu_us,
        "cores": rate * cpu_us * 1e-6,
        "memory_bytes": constants["rss_base_bytes"] + ranks * per_rank,
        "in_bits_per_s": 8 * rate * wire_bytes(
            evaluate("bytes", constants["request_bytes"], x)),
        # Every contribution is answered: a round sends W answers.
        "out_bits_per_s": 8 * rate * wire_bytes(
            evaluate("bytes", constants["answer_bytes"], x)),
    }


def over(load, res):
    """The resources that `load` exceeds on a shard of `res`, planned at
    res.utilization: a list of names, empty when it fits."""
    u = res.utilization
    names = []
    if load["cores"] > u * res.cores:
        names.append("cpu")
    if load["memory_bytes"] > u * res.memory_bytes:
        names.append("memory")
    if max(load["in_bits_per_s"], load["out_bits_per_s"]) > u * res.nic_bits_per_s:
        names.append("network")
    return names


def completion_ms(constants, mode, ranks, channels):
    """A round of `ranks` contributions, from the last one sent to the last
    answer, with one contribution in flight per rank."""
    return predict(constants, mode, "completion_ms", ranks, channels)


def size(constants, ranks, layers, channels, steps_per_s, shards=None,
         res=None):
    """The sizing of a job (every layer of `channels`): a dict with the
    job's totals, one layer's load alone on a shard ("layer"), the shards
    needed (the fewest n whose busiest shard, holding ceil(L/n) layers,
    fits; None when a shard of one layer does not, and "over" then names
    what one layer's rounds exceed), the busiest shard's load ("shard")
    for `shards` (default: the shards needed, else L), and the step's
    rounds against the step."""
    res = res or Resources()

    def load(layers_on_shard):
        return shard_load(constants, ranks, channels, steps_per_s, layers_on_shard, res)

    needed = next((n for n in range(1, layers + 1)
                   if not over(load(math.ceil(layers / n)), res)), None)
    n = shards or needed or layers
    per_shard = math.ceil(layers / n)
    whole = load(layers)
    t = completion_ms(constants, res.mode, ranks, channels)
    return {
        "ranks": ranks, "layers": layers, "channels": channels,
        "steps_per_s": steps_per_s,
        "job_contributions_per_s": whole["contributions_per_s"],
        "job_cores": whole["cores"],
        "layer": load(1),
        "over": over(load(1), res),
        "shards_needed": needed,
        "shards": n,
        "layers_per_shard": per_shard,
        "shard": load(per_shard),
        "shard_over": over(load(per_shard), res),
        "completion_ms": t,
        # Each layer's forward waits for its round, and so does its
        # backward: a step runs 2·L rounds one after another.
        "rounds_ms_per_step": 2 * layers * t,
        "step_ms": 1000.0 / steps_per_s,
    }


def relayed(constants, ranks, layers, channels, steps_per_s, fan_in, res=None):
    """A job's rounds through a tree of relays (docs/relay.md) that each
    merge `fan_in` contributions (an aligned power-of-two block of rank
    positions, or of the blocks below): levels = ceil(log_fan_in(ranks))
    rounds one after another, the last the shard's. A dict of the round's
    completion, the shard's load for one layer, and one relay's load (it
    serves every layer of its block). A relay is taken to cost what a
    shard costs at its width times constants["relay_cpu_factor"] (1 when
    absent; measured, see CONSTANTS), in its CPU and in its round's
    completion, and each runs on a core of its own, in parallel with the
    other relays of its level."""
    res = res or Resources()
    factor = constants.get("relay_cpu_factor", 1.0)
    levels, width, relays = 1, ranks, 0
    while width > fan_in:
        width = math.ceil(width / fan_in)
        relays += width
        levels += 1
    t = ((levels - 1) * factor * completion_ms(constants, res.mode, fan_in, channels)
         + completion_ms(constants, res.mode, width, channels))
    relay = shard_load(constants, fan_in, channels, steps_per_s, layers, res)
    relay["cpu_us"] *= factor
    relay["cores"] *= factor
    plan = {
        "fan_in": fan_in, "levels": levels, "relays": relays, "top": width,
        "completion_ms": t,
        "rounds_ms_per_step": 2 * layers * t,
        "shard_layer": shard_load(constants, width, channels, steps_per_s, 1, res),
        "relay": relay,
    }
    plan["over"] = sorted(set(over(plan["shard_layer"], res) + over(plan["relay"], res)))
    return plan


# The fan-ins a relay tree may use: powers of two within the widths the
# benchmark measured (W = 8 .. 4096), so that no level extrapolates t(W).
FAN_INS = tuple(2 ** i for i in range(3, 13))


def best_relay(constants, ranks, layers, channels, steps_per_s, res=None):
    """Of the relay trees with a fan-in of FAN_INS below `ranks`, the one
    whose round completes soonest among those whose shard and relays fit
    (else among all); None when no fan-in is below `ranks`."""
    plans = [relayed(constants, ranks, layers, channels, steps_per_s, b, res)
             for b in FAN_INS if b < ranks]
    if not plans:
        return None
    fitting = [p for p in plans if not p["over"]]
    return min(fitting or plans, key=lambda p: p["completion_ms"])


def first_w(predicate, limit=2**20):
    """The least W in 1..limit for which predicate(W) holds, for a
    predicate that stays true once true (the model's loads grow with W);
    None if it never does."""
    if not predicate(limit):
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def limits(constants, layers, channels, steps_per_s, res=None):
    """Where a direct round stops serving a job of `layers` layers of
    `channels` at `steps_per_s`: the least W at which one layer's rounds
    need more than a shard's cores (at res.utilization), at which the
    step's 2·L rounds take longer than the step, and at which a relayed
    round (best block) completes sooner than the direct one."""
    res = res or Resources()
    step_ms = 1000.0 / steps_per_s

    def direct_ms(w):
        return completion_ms(constants, res.mode, w, channels)

    def relay_faster(w):
        plan = best_relay(constants, w, layers, channels, steps_per_s, res)
        return plan is not None and plan["completion_ms"] < direct_ms(w)

    return {
        "cpu_w": first_w(lambda w: shard_load(constants, w, channels, steps_per_s, 1, res)["cores"]
                         > res.utilization * res.cores),
        "step_w": first_w(lambda w: 2 * layers * direct_ms(w) > step_ms),
        # Blocks are powers of two, so this is monotone only nearly: the
        # bisection may land a few ranks off the exact first W.
        "relay_faster_w": first_w(relay_faster),
    }


def format_sizing(s, out=None):
    """Prints size()'s answer, one quantity a line."""
    out = out or sys.stdout

    def line(name, value):
        out.write("  %-40s %s\n" % (name, value))

    def load_lines(prefix, load):
        line(prefix + "contributions/s", "{:,.0f}".format(load["contributions_per_s"]))
        line(prefix + "cores", "%.3f" % load["cores"])
        line(prefix + "memory", "%.3f GiB" % (load["memory_bytes"] / 2**30))
        line(prefix + "network in / out", "%.3f / %.3f Gb/s"
             % (load["in_bits_per_s"] / 1e9, load["out_bits_per_s"] / 1e9))

    out.write("job: N = %d ranks, L = %d layers, C = %d channels, S = %g steps/s\n"
              % (s["ranks"], s["layers"], s["channels"], s["steps_per_s"]))
    line("contributions/s (2·N·L·S)", "{:,.0f}".format(s["job_contributions_per_s"]))
    line("server CPU per contribution", "%.1f us" % s["layer"]["cpu_us"])
    line("cores, whole job", "%.2f" % s["job_cores"])
    load_lines("one layer alone: ", s["layer"])
    if s["shards_needed"] is None:
        line("shards needed", "none suffices: one layer's rounds exceed a shard's "
             + ", ".join(s["over"]))
    else:
        line("shards needed", "%d" % s["shards_needed"])
    line("busiest of %d shard(s): layers" % s["shards"], "%d" % s["layers_per_shard"])
    load_lines("  ", s["shard"])
    line("  over", ", ".join(s["shard_over"]) or "nothing")
    line("round completion", "%.2f ms" % s["completion_ms"])
    line("2·L rounds a step", "%.1f ms of a %.1f ms step (%.0f%%)"
         % (s["rounds_ms_per_step"], s["step_ms"],
            100 * s["rounds_ms_per_step"] / s["step_ms"]))


def format_relay(constants, ranks, layers, channels, steps_per_s, res, out=None):
    """Prints where direct rounds stop serving such a job, and the best
    relayed plan for `ranks`."""
    out = out or sys.stdout
    lim = limits(constants, layers, channels, steps_per_s, res)
    out.write("direct rounds: one layer past a shard's cores from W = %s;"
              " the step's 2·L rounds past the step from W = %s;"
              " relayed rounds complete sooner from W = %s\n"
              % (lim["cpu_w"], lim["step_w"], lim["relay_faster_w"]))
    plan = best_relay(constants, ranks, layers, channels, steps_per_s, res)
    if plan:
        out.write("best relay tree for N = %d: fan-in %d, %d levels (%d relays), the"
                  " shard's round of %d: round %.2f ms, 2·L rounds %.1f ms a step;"
                  " shard %.3f cores a layer, a relay %.3f cores; over: %s\n"
                  % (ranks, plan["fan_in"], plan["levels"], plan["relays"], plan["top"],
                     plan["completion_ms"], plan["rounds_ms_per_step"],
                     plan["shard_layer"]["cores"], plan["relay"]["cores"],
                     ", ".join(plan["over"]) or "nothing"))


def main(argv=None):
    p = argparse.ArgumentParser(
        description="The aggregator's capacity model (docs/operations.md, Capacity).")
    p.add_argument("--fit", metavar="FILE.jsonl",
                   help="wide_benchmark's rows: fit the constants and check them")
    p.add_argument("--predict", nargs=4, metavar=("N", "L", "C", "S"),
                   help="ranks, layers, channels, steps per second")
    p.add_argument("--shards", type=int, help="the shards the job is spread over")
    p.add_argument("--mode", default="lockstep", choices=("lockstep", "pipelined"))
    p.add_argument("--cores", type=float, default=1.0, help="cores per shard (RPC thread)")
    p.add_argument("--memory_gib", type=float, default=2.0, help="memory per shard")
    p.add_argument("--nic_gbps", type=float, default=10.0, help="NIC per shard")
    p.add_argument("--utilization", type=float, default=0.7,
                   help="the share of each resource a plan may use")
    p.add_argument("--markdown", action="store_true",
                   help="print --fit's table in Markdown (for docs/operations.md)")
    a = p.parse_args(argv)
    if not a.fit and not a.predict:
        p.error("give --fit FILE, --predict N L C S, or both")
    constants = CONSTANTS
    status = 0
    if a.fit:
        with open(a.fit) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        constants = fit(rows)
        print("constants (%s):" % constants["measured"])
        print(json.dumps(constants, indent=1, sort_keys=True))
        misses = check(constants, rows, markdown=a.markdown)
        if misses:
            print("%d prediction(s) miss by more than %.0f%%:" % (len(misses), 100 * TOLERANCE))
            for r, quantity, err in misses:
                print("  %s W=%d L=%d C=%d %s %+.0f%%"
                      % (r["mode"], r["W"], r["L"], r["C"], quantity, 100 * err))
            status = 1
        else:
            print("every prediction within %.0f%% of its measurement" % (100 * TOLERANCE))
    if a.predict:
        n, layers, c = (int(v) for v in a.predict[:3])
        s = float(a.predict[3])
        res = Resources(a.cores, a.memory_gib * 2**30, a.nic_gbps * 1e9,
                        a.utilization, a.mode)
        format_sizing(size(constants, n, layers, c, s, a.shards, res))
        format_relay(constants, n, layers, c, s, res)
    return status


if __name__ == "__main__":
    sys.exit(main())
