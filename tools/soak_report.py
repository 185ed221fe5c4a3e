#!/usr/bin/env python3
"""The report and verdict of a tools/soak.sh run, from the files it left in --out_dir.

Reads summary.json (treespec-loadgen's summary of the soak's load), restarts.tsv (one line per
drafter kill: n, seconds into the run, the dying incarnation's VmRSS in KiB and trees drafted,
restart ok) and rss.tsv (every 5 s: seconds, verifier KiB, drafter KiB); the rest comes as flags
from soak.sh. Writes report.json, prints it as a table, and exits 1 on FAIL.

PASS needs all of:
  - failed == 0 (requests the client cancelled are counted apart, never as failed);
  - the verifier's VmRSS at the end within --rss_bound_mib of its start (after warm-up);
  - the drafter's largest VmRSS (any incarnation: sampled every 5 s and before each kill)
    within the bound of the first incarnation's start;
  - the verifier alive at the end, and the drafter up;
  - every restart came up, and every restarted incarnation drafted trees (the verifier
    reconnected to it);
  - treespec-loadgen exited 0 (its --check_metrics against the verifier's counters included).
Standard library only: soak.sh runs it with Debian's python3.
"""

import argparse
import json
import os
import sys

MIB = 1024  # KiB per MiB


def read_tsv(path):
    """Rows of whole numbers; none when the file is missing or empty."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [[int(float(x)) for x in line.split()] for line in f if line.strip()]


def pair(text):
    start, end = text.split(",")
    return int(start), int(end)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", required=True)
    p.add_argument("--duration_s", type=float, required=True)
    p.add_argument("--request_rate", type=float, required=True)
    p.add_argument("--cancel_fraction", type=float, required=True)
    p.add_argument("--kill_every_s", required=True)
    p.add_argument("--down_s", type=float, required=True)
    p.add_argument("--rss_bound_mib", type=float, required=True)
    p.add_argument("--loadgen_rc", type=int, required=True)
    p.add_argument("--kill_loop_rc", type=int, required=True)
    p.add_argument("--verifier_rss", type=pair, required=True, help="START,END in KiB")
    p.add_argument("--drafter_rss", type=pair, required=True, help="START,END in KiB")
    p.add_argument("--verifier_alive", type=int, required=True)
    p.add_argument("--drafter_alive", type=int, required=True)
    p.add_argument("--final_trees", type=float, required=True,
                   help="trees the last drafter incarnation drafted (-1: scrape failed)")
    a = p.parse_args()

    summary = {}
    summary_path = os.path.join(a.out_dir, "summary.json")
    if os.path.exists(summary_path) and os.path.getsize(summary_path) > 0:
        with open(summary_path) as f:
            summary = json.load(f)
    restarts = read_tsv(os.path.join(a.out_dir, "restarts.tsv"))
    samples = read_tsv(os.path.join(a.out_dir, "rss.tsv"))

    bound_kib = a.rss_bound_mib * MIB
    v_start, v_end = a.verifier_rss
    d_start, d_end = a.drafter_rss
    v_max = max([v_end] + [row[1] for row in samples])
    d_max = max([d_end] + [row[2] for row in samples] + [row[2] for row in restarts])
    # Trees drafted by incarnation k (0 = the first): row k of restarts.tsv is its kill; the last
    # one was scraped at the end.
    trees = [row[3] for row in restarts] + [int(a.final_trees)]
    restarted_trees = trees[1:]

    failed = summary.get("failed")
    reasons = []
    if not summary:
        reasons.append("no summary from treespec-loadgen (see loadgen.log)")
    elif failed != 0:
        reasons.append(f"{failed} requests failed: {summary.get('errors')}")
    if v_end - v_start > bound_kib:
        reasons.append(f"verifier VmRSS grew {(v_end - v_start) / MIB:.1f} MiB "
                       f"(bound {a.rss_bound_mib:g} MiB)")
    if d_max - d_start > bound_kib:
        reasons.append(f"drafter VmRSS reached {(d_max - d_start) / MIB:.1f} MiB over its start "
                       f"(bound {a.rss_bound_mib:g} MiB)")
    if not a.verifier_alive:
        reasons.append("the verifier is no longer running")
    if not a.drafter_alive:
        reasons.append("no drafter is running at the end")
    if a.kill_loop_rc != 0 or any(row[4] != 1 for row in restarts):
        reasons.append("a drafter restart failed (see kills.log)")
    unreached = [k for k, t in enumerate(restarted_trees, start=1) if t <= 0]
    if unreached:
        reasons.append(f"restarted drafter incarnations {unreached} drafted no tree (the verifier "
                       "did not reconnect, or the scrape failed)")
    if a.loadgen_rc != 0:
        check = summary.get("metrics_check", {})
        reasons.append(f"treespec-loadgen exited {a.loadgen_rc} (metrics_check: "
                       f"{check.get('mismatches') or check.get('error') or 'n/a'})")

    def figure(key):
        value = summary.get(key)
        return round(value, 2) if isinstance(value, float) else value

    report = {
        "verdict": "FAIL" if reasons else "PASS",
        "reasons": reasons,
        "settings": {
            "duration_s": a.duration_s,
            "request_rate": a.request_rate,
            "cancel_fraction": a.cancel_fraction,
            "kill_every_s": a.kill_every_s,
            "down_s": a.down_s,
            "rss_bound_mib": a.rss_bound_mib,
        },
        "requests": {
            "completed": summary.get("completed"),
            "failed": failed,
            "cancelled": summary.get("cancelled"),
            "not_sent": summary.get("not_sent"),
            "errors": summary.get("errors"),
        },
        "latency_ms": {
            "median_e2el": figure("median_e2el_ms"),
            "p99_e2el": figure("p99_e2el_ms"),
            "median_ttft": figure("median_ttft_ms"),
            "p99_ttft": figure("p99_ttft_ms"),
        },
        "request_throughput": figure("request_throughput"),
        "spec_decode_acceptance_length": figure("spec_decode_acceptance_length"),
        "metrics_check": summary.get("metrics_check", {}).get("ok"),
        "drafter_restarts": sum(1 for row in restarts if row[4] == 1),
        "drafter_kills_at_s": [row[1] for row in restarts],
        "drafter_trees_per_incarnation": trees,
        "rss_mib": {
            "verifier": {"start": round(v_start / MIB, 1), "end": round(v_end / MIB, 1),
                         "max": round(v_max / MIB, 1),
                         "growth": round((v_end - v_start) / MIB, 1)},
            "drafter": {"start": round(d_start / MIB, 1), "end": round(d_end / MIB, 1),
                        "max": round(d_max / MIB, 1),
                        "growth_of_max": round((d_max - d_start) / MIB, 1)},
        },
    }
    with open(os.path.join(a.out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")

    r, lat, rss = report["requests"], report["latency_ms"], report["rss_mib"]
    print(f"soak: {a.duration_s:g} s at {a.request_rate:g} req/s, cancel fraction "
          f"{a.cancel_fraction:g}, drafter killed every {a.kill_every_s} s")
    print(f"  requests   completed {r['completed']}, failed {r['failed']}, "
          f"cancelled {r['cancelled']}")
    print(f"  latency    E2E median {lat['median_e2el']} ms, p99 {lat['p99_e2el']} ms; "
          f"TTFT median {lat['median_ttft']} ms, p99 {lat['p99_ttft']} ms")
    print(f"  drafter    {report['drafter_restarts']} restarts (at {report['drafter_kills_at_s']} "
          f"s), trees per incarnation {trees}")
    for name in ("verifier", "drafter"):
        s = rss[name]
        print(f"  VmRSS      {name}: start {s['start']} MiB, end {s['end']} MiB, "
              f"max {s['max']} MiB")
    print(f"  acceptance length {report['spec_decode_acceptance_length']}, "
          f"counters check {report['metrics_check']}")
    print(f"  {report['verdict']}" + "".join(f"\n    - {x}" for x in reasons))
    print(f"  report: {os.path.join(a.out_dir, 'report.json')}")
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
