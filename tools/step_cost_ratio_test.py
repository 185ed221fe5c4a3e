#!/usr/bin/env python3
"""Checks tools/step_cost_ratio.py's median against hand-computed histogram quantiles."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_cost_ratio import median  # noqa: E402

INF = float("inf")
before = [(0.9, 2), (1.0, 2), (1.1, 4), (INF, 4)]
# Since `before`: 4 steps in (0.9, 1.0], 4 in (1.0, 1.1], 2 above 1.1; total 10, rank 5.
after = [(0.9, 2), (1.0, 6), (1.1, 12), (INF, 14)]
assert abs(median(before, after) - 1.025) < 1e-9, median(before, after)
# All of them above the last finite bound: that bound.
assert median([(1.0, 0), (INF, 0)], [(1.0, 0), (INF, 3)]) == 1.0
# No steps in between: no median.
assert median(after, after) is None
# The first bucket interpolates from 0.
assert abs(median([(0.5, 0), (INF, 0)], [(0.5, 4), (INF, 4)]) - 0.25) < 1e-9
print("step_cost_ratio_test: ok")
