"""Payload fingerprints (issue 18): the hash each contribution gets as it
joins a round, so that a resend can be told from a conflict. The kind this
build writes (half-word lanes, 32-bit vector multiplies) against the kind
before it (word lanes, one 64-bit multiply per word), in ns per payload
and words per ns, measured by the same process in the same run
(bench/fingerprint_bench.cc)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def main():
    out, reps = common.run_micro("bench/bench-fingerprint")
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if not parts or parts[0] != "FP":
            continue
        channels, half, word = int(parts[1]), float(parts[2]), float(parts[3])
        words = 2 * channels + 5  # kind, count, two sizes, the doubles
        rows.append([channels, "%.0f" % half, "%.0f" % word,
                     "%.2f" % (words / half), "%.2f" % (words / word)])
        common.ratio("fingerprint_ns[C=%d]" % channels, half,
                     "word_lanes_ns", word, "ns")
    print("\n### Payload fingerprint of a forward contribution "
          "(best of %d passes)\n" % reps)
    common.table(["channels", "half-word lanes, ns", "word lanes, ns",
                  "half-word lanes, words/ns", "word lanes, words/ns"], rows)


if __name__ == "__main__":
    main()
    common.require_ratios()
