#!/usr/bin/python3
"""Writes the fuzz seed corpus (tests/fuzz/corpus/) of
server/rpc/request_fuzz.cc.

Each seed is one mode byte (0 Contribution, 1 CreateJobRequest, 2/5/8/11
the job/layer/round/checkpoint record decoders: mode % 3 == 2 and
(mode // 3) % 4 picks the decoder) followed by a protobuf message, encoded
here by hand so that no generated code is needed. Run it again after
changing the messages: /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, value):
    """An int (varint), float (double), bytes/str (length) or list (packed doubles)."""
    if isinstance(value, bool) or isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, float):
        return varint(num << 3 | 1) + struct.pack("<d", value)
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, list):
        value = b"".join(struct.pack("<d", v) for v in value)
    return varint(num << 3 | 2) + varint(len(value)) + value


def fixed64(num, value):
    return varint(num << 3 | 1) + struct.pack("<Q", value)


def moments(count, mean, m2):
    return field(1, count) + field(2, mean) + field(3, m2)


def contribution(job, layer, step, phase, rank, payload=None, grad=None):
    out = field(1, job) + field(2, layer) + field(3, step) + field(4, phase)
    out += field(5, rank)
    if payload is not None:
        out += field(6, payload)
    if grad is not None:
        out += field(7, grad)
    return out


def layer_spec(name, features, mode=0, momentum=0.0):
    return field(1, name) + field(2, features) + field(3, mode) + field(4, momentum)


def create_job(job, world, layers, group=0, timeout=0, quorum=None):
    out = field(1, job) + field(2, world)
    for l in layers:
        out += field(3, l)
    out += field(4, group) + field(5, timeout)
    if quorum is not None:
        out += field(6, field(1, quorum[0]) + field(2, quorum[1]))
    return out


def stats(n, mean, var):
    return field(1, n) + field(2, mean) + field(3, var)


def layer_state(n, mean, var, last=-1):
    return field(1, stats(n, mean, var)) + field(2, last) + field(3, last) + field(4, last)


SEEDS = {
    # Contributions (mode 0) to the fuzzer's jobs a (2 ranks, 2 channels),
    # b (4 ranks in groups of 2, 3 channels, quorum 1) and c (1 rank).
    "contribution-forward-a": (0, contribution("a", 0, 1, 1, 0, moments(3, [1.0, 2.0], [0.5, 0.25]))),
    "contribution-forward-b": (0, contribution("b", 1, 4, 1, 3, moments(2, [1.0, 2.0, 3.0], [0.5, 0.5, 0.5]))),
    "contribution-forward-c": (0, contribution("c", 0, 7, 1, 0, moments(5, [4.0], [2.0]))),
    "contribution-count1-c": (0, contribution("c", 1, 9, 1, 0, moments(1, [4.0], [0.0]))),
    "contribution-backward-a": (0, contribution("a", 1, 2, 2, 1, grad=field(1, [1.0, -1.0]) + field(2, [0.5, 0.5]))),
    "contribution-nan": (0, contribution("a", 0, 3, 1, 0, moments(3, [float("nan"), 2.0], [0.5, 0.25]))),
    "contribution-bad-rank": (0, contribution("a", 0, 3, 1, 9, moments(3, [1.0, 2.0], [0.5, 0.25]))),
    "contribution-unknown-job": (0, contribution("zz", 0, 3, 1, 0, moments(3, [1.0, 2.0], [0.5, 0.25]))),
    "contribution-empty-batch": (0, contribution("a", 0, 5, 1, 1, moments(0, [0.0, 0.0], [0.0, 0.0]))),
    # CreateJobRequests (mode 1).
    "createjob-valid": (1, create_job("fz", 4, [layer_spec("bn1", 3)], 2, 500)),
    "createjob-quorum": (1, create_job("fq", 4, [layer_spec("bn1", 2, 2, 0.9)], 0, 1000, (3, 200))),
    "createjob-bad-quorum": (1, create_job("fb", 4, [layer_spec("bn1", 2)], 0, 1000, (9, 5000))),
    "createjob-no-layers": (1, create_job("fn", 2, [])),
    "createjob-bad-id": (1, create_job("a/b", 2, [layer_spec("x", 1)])),
    # State records: JobRecord (2), LayerRecord (5), RoundRecord (8),
    # CheckpointRecord (11).
    "record-job": (2, field(1, 1) + field(2, "j") + field(3, 2) + field(4, 2) + field(5, 1000)
                   + field(6, field(1, "bn") + field(2, 2) + field(3, 1) + field(4, 0.1)
                           + field(6, True) + field(7, [0.0, 0.0]) + field(8, [1.0, 1.0]))
                   + field(7, 1) + field(8, 100)),
    "record-layer": (5, field(1, 1) + field(2, layer_state(3, [0.1, 0.2], [1.0, 0.9], 2))),
    "record-round": (8, field(1, 1) + field(2, 1) + field(3, 4) + field(4, 1) + field(5, 6)
                     + field(6, [1.0, 2.0]) + field(7, [0.5, 0.5])
                     + field(10, field(1, True) + fixed64(2, 123)) + field(10, field(1, False))
                     + field(11, stats(1, [0.1, 0.2], [0.9, 0.9])) + field(12, 1)),
    "record-checkpoint": (11, field(1, 1) + field(2, "a") + field(3, 4) + field(4, "tag")
                          + field(5, 1700000000000)
                          + field(6, field(1, 0) + field(2, 0) + field(3, layer_state(1, [0.1, 0.2], [1.0, 1.0], 4)))
                          + field(6, field(1, 0) + field(2, 1) + field(3, layer_state(1, [0.1, 0.2], [1.0, 1.0], 4)))),
    "record-newer-format": (2, field(1, 99) + field(2, "j")),
}


def main():
    out = os.path.join(HERE, "corpus")
    os.makedirs(out, exist_ok=True)
    for name, (mode, body) in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([mode]) + body)


if __name__ == "__main__":
    main()
