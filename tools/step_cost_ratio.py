#!/usr/bin/env python3
"""The verifier's step-cost score over an interval: the median of measured / predicted verify
step time (the treespec_step_cost_ratio histogram of its /metrics), between a snapshot taken
before and the counts now, interpolated within a bucket as Prometheus' histogram_quantile does.

  tools/step_cost_ratio.py snapshot HOST:PORT FILE   # keep the histogram's counts in FILE
  tools/step_cost_ratio.py median HOST:PORT FILE     # print the median since FILE (or "null")
"""
import json
import re
import sys
import urllib.request

BUCKET = re.compile(r'^treespec_step_cost_ratio_bucket\{le="([^"]+)"\} ([0-9.e+]+)$')


def buckets(address):
    """[(upper bound, cumulative count)] of the histogram, in order."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out = []
    for line in text.splitlines():
        m = BUCKET.match(line.strip())
        if m:
            out.append((float(m.group(1)), float(m.group(2))))
    return out


def median(before, after):
    """The interpolated median of the observations between two bucket lists; None if none."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    total = counts[-1][1] if counts else 0
    if total <= 0:
        return None
    rank, lower, below = total / 2, 0.0, 0.0
    for le, cumulative in counts:
        if cumulative >= rank:
            if le == float("inf"):
                return lower  # above the last finite bound: report that bound
            inside = cumulative - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1)
        lower, below = le, cumulative
    return lower


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("snapshot", "median"):
        sys.exit(__doc__)
    command, address, path = sys.argv[1:]
    now = buckets(address)
    if command == "snapshot":
        json.dump(now, open(path, "w"))
    else:
        value = median(json.load(open(path)), now)
        print("null" if value is None else f"{value:.4f}")


if __name__ == "__main__":
    main()
