#!/usr/bin/env python3
"""Plots a concurrency sweep (bench/concurrency_sweep.sh's sweep.json) as an SVG: output
tokens/s against concurrency (log2 axis), one line per setting (speculation off, fixed tree
budgets, the step-cost model's auto). Plain SVG, no plotting library needed.

  tools/plot_sweep.py SWEEP_JSON OUT_SVG
"""
import json
import math
import sys

COLORS = ["#444444", "#1f77b4", "#2ca02c", "#9467bd", "#d62728", "#ff7f0e", "#8c564b"]
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 400, 70, 130, 30, 50


def nice_max(v):
    """The smallest 1, 2 or 5 × 10^k at or above v."""
    if v <= 0:
        return 1
    base = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 5, 10):
        if m * base >= v:
            return m * base
    return 10 * base


def what(sweep):
    """The title's description: target, drafter kind (and replace rate), device."""
    parts = []
    if "target" in sweep:
        parts.append(sweep["target"].rstrip("/").split("/")[-1])
    mode = sweep.get("mode", "")
    if "replay_replace_rate" in sweep:
        mode += f" (replace rate {sweep['replay_replace_rate']:g})"
    return parts + [mode, sweep.get("device", "")]


def plot(sweep):
    conc = sweep["concurrency"]
    settings = sweep["settings"]
    ys = {s: [sweep["points"][f"{s}_c{c}"]["tokens_per_s"] for c in conc] for s in settings}
    ymax = nice_max(max(max(v) for v in ys.values()))
    xlo, xhi = math.log2(min(conc)), math.log2(max(conc))
    xspan = max(xhi - xlo, 1)

    def x(c):
        return LEFT + (math.log2(c) - xlo) / xspan * (W - LEFT - RIGHT)

    def y(v):
        return TOP + (1 - v / ymax) * (H - TOP - BOTTOM)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="18" text-anchor="middle">output tokens/s vs concurrency '
             f'({", ".join(what(sweep))})</text>']
    for i in range(6):  # horizontal grid and y labels
        v = ymax * i / 5
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                     f'stroke="#dddddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for c in conc:  # x labels
        parts.append(f'<text x="{x(c):.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{c}</text>')
    parts.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 12}" text-anchor="middle">'
                 'concurrent clients</text>')
    for i, s in enumerate(settings):
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{x(c):.1f},{y(v):.1f}" for c, v in zip(conc, ys[s]))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" '
                     'stroke-width="2"/>')
        for c, v in zip(conc, ys[s]):
            parts.append(f'<circle cx="{x(c):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>')
        label = {"off": "speculation off", "auto": "auto (step-cost model)"}.get(
            s, f"tree budget {s}")
        ly = TOP + 16 * i + 10
        parts.append(f'<line x1="{W - RIGHT + 10}" x2="{W - RIGHT + 28}" y1="{ly - 4}" '
                     f'y2="{ly - 4}" stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{W - RIGHT + 32}" y="{ly}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        sweep = json.load(f)
    with open(sys.argv[2], "w") as f:
        f.write(plot(sweep))


if __name__ == "__main__":
    main()
