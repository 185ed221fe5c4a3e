#!/usr/bin/env python3
"""Regenerates docs/performance.md and README.md's "Current figures" from docs/bench/*.json.

    tools/perf_report.py            # rewrite both from the JSON
    tools/perf_report.py --check    # exit 1 if either is not what the JSON gives (ctest runs it)

The JSON comes from tools/bench_all.sh (one file per benchmark, plus meta-gpu.json and
meta-cpu.json: date, commit, machine, the commands). A figure changes here only by measuring
again: run bench_all.sh into docs/bench/, then this script. Experiments (kept or not) go to
docs/experiments/, not here.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_sweep  # noqa: E402  (tools/plot_sweep.py: the sweeps' SVGs)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "docs", "bench")
PERF = os.path.join(ROOT, "docs", "performance.md")
README = os.path.join(ROOT, "README.md")
IMG = os.path.join(ROOT, "docs", "img")
BEGIN, END = "<!-- current-figures:begin -->", "<!-- current-figures:end -->"


def load(name):
    path = os.path.join(BENCH, name)
    return json.load(open(path)) if os.path.exists(path) else None


def span(values, fmt="{:.2f}", unit=""):
    lo, hi = min(values), max(values)
    text = fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}–{fmt.format(hi)}"
    return text + unit


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def provenance(meta, bench, doc=None):
    """The line under each table: where, when, at which commit, by which command."""
    run = meta["benches"][bench]
    parts = [run["machine"], run["date"], f"commit `{run['commit']}`"]
    if doc is not None and "device" in doc:
        parts.append(f"ceilings measured first: copy {doc['copy_bandwidth_bytes_per_s'] / 1e12:.2f}"
                     f" TB/s, bf16 GEMM {doc['bf16_gemm_flops_per_s'] / 1e12:.0f} TFLOP/s")
    return [f"*{'; '.join(parts)}.* Command: `{run['command']}` (all of them: "
            f"`{meta['command']}`)."]


def us(v):
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


class Report:
    def __init__(self):
        self.gpu = load("meta-gpu.json")
        self.cpu = load("meta-cpu.json")
        self.lines = []
        self.images = {}  # docs/img/ file name -> SVG text
        self.figures = []  # README rows: metric, value, vs, machine, date, commit, command

    @staticmethod
    def has(meta, bench):
        return meta is not None and bench in meta["benches"]

    def figure(self, meta, bench, metric, value, versus):
        run = meta["benches"][bench]
        self.figures.append([metric, value, versus, run["machine"], run["date"],
                             f"`{run['commit']}`", f"`{run['command']}`"])

    def section(self, title, intro, meta, bench, doc, header, rows):
        self.lines += ["", f"## {title}", "", intro, ""] + table(header, rows) + [""]
        self.lines += provenance(meta, bench, doc)

    def verify_step(self, name="verify_step", title="Verify step, Llama-3-8B shape, one GPU",
                    intro_extra=" Target (DESIGN §7): ≤ 1.3× the floor for trees of 1–64 nodes "
                                "at 1k–32k; host share ≤ 5 %.", figures=True):
        doc = load(f"{name}.json")
        if doc is None or not self.has(self.gpu, name):
            return
        rs = [r for r in doc["results"] if r["tp"] == 1]
        rows = [[r["context"], r["nodes"], us(r["wall_us"]), us(r["gpu_span_us"]),
                 us(r["floor_us"]), f"{r['ratio_to_floor']:.2f}×",
                 f"{100 * r['host_share']:.1f} %"] for r in rs]
        self.section(
            title,
            "One whole verify step (forward of the tree, the choice at every node, the walk, "
            "the KV commit) of a random-weight 32-layer 8B-shaped target, as a CUDA graph. "
            "Floor = max(every weight once + the K/V read and written / copy bandwidth, FLOPs / "
            "bf16 GEMM rate)." + intro_extra,
            self.gpu, name, doc,
            ["context", "nodes", "wall µs", "GPU span µs", "floor µs", "wall / floor",
             "host share"], rows)
        if not figures:
            return
        for n in sorted({r["nodes"] for r in rs}):
            sel = [r for r in rs if r["nodes"] == n]
            ctx = f"{min(r['context'] for r in sel) // 1024}k–{max(r['context'] for r in sel) // 1024}k"
            self.figure(self.gpu, "verify_step", f"Verify step, 8B shape, {n}-node tree, {ctx}",
                        span([r["wall_us"] / 1e3 for r in sel], "{:.2f}", " ms"),
                        span([r["ratio_to_floor"] for r in sel], "{:.2f}", "× floor"))
        self.figure(self.gpu, "verify_step", "Host share of the verify step",
                    f"≤ {100 * max(r['host_share'] for r in rs):.1f} %", "target ≤ 5 %")

    def attention(self):
        doc = load("attention.json")
        if doc is None or not self.has(self.gpu, "attention"):
            return
        rs = doc["results"]
        rows = [[r["context"], r["nodes"], r["batch"], us(r["median_us"]), us(r["floor_us"]),
                 f"{r['median_us'] / r['floor_us']:.2f}×",
                 f"{r['bytes_per_s'] / 1e12:.2f}", f"{r['flops_per_s'] / 1e12:.0f}"] for r in rs]
        self.section(
            "Tree attention, one layer, Llama-3-8B shape",
            "32 q / 8 KV heads, head dim 128, pages of 16, a random tree per sequence; each launch "
            "after an L2 flush, median of 20. Floor = max(K/V + q + out bytes / copy bandwidth, "
            "FLOPs / bf16 GEMM rate). Targets (DESIGN §7): ≤ 1.25× for ≤ 16 nodes at ≥ 32k, "
            "≤ 2× for 64 and 256 nodes, ≤ 10 µs at 1k.",
            self.gpu, "attention", doc,
            ["context", "nodes", "batch", "µs", "floor µs", "µs / floor", "TB/s", "TFLOP/s"], rows)
        def pick(ctx, nodes, batch):
            return [r for r in rs if r["context"] in ctx and r["nodes"] in nodes and
                    r["batch"] == batch]
        small = pick({32768, 131072}, {1, 16}, 1) + pick({32768, 131072}, {1, 16}, 8)
        if small:
            self.figure(self.gpu, "attention", "Tree attention, 1–16 nodes, ≥ 32k, batch 1 and 8",
                        span([r["median_us"] / r["floor_us"] for r in small], "{:.2f}", "× floor"),
                        "target ≤ 1.25×")
        big = pick({32768, 131072}, {64, 256}, 1) + pick({32768, 131072}, {64, 256}, 8)
        if big:
            self.figure(self.gpu, "attention", "Tree attention, 64–256 nodes, ≥ 32k",
                        span([r["median_us"] / r["floor_us"] for r in big], "{:.2f}", "× floor"),
                        "target ≤ 2×")
        short = pick({1024}, {1, 16}, 1)
        if short:
            self.figure(self.gpu, "attention", "Tree attention, 1k context, 1–16 nodes",
                        span([r["median_us"] for r in short], "{:.1f}", " µs"), "target ≤ 10 µs")

    def gemm(self):
        doc = load("gemm.json")
        if doc is None or not self.has(self.gpu, "gemm"):
            return
        best = {}
        for r in doc["results"]:
            family = "cuBLASLt" if r["kernel"].startswith("cublaslt") else "few-row"
            key = (r["gemm"], r["rows"], family)
            if key not in best or r["chain_us"] < best[key]["chain_us"]:
                best[key] = r
        rows = []
        for (name, nrows) in sorted({(k[0], k[1]) for k in best}, key=lambda k: (k[1], k[0])):
            ours, lt = best.get((name, nrows, "few-row")), best.get((name, nrows, "cuBLASLt"))
            ref = ours or lt
            rows.append([name, nrows, f"{ref['n']}×{ref['k']}", us(ref["floor_us"]),
                         f"{ours['chain_us'] / ours['floor_us']:.2f}× ({ours['kernel']})"
                         if ours else "—",
                         f"{lt['chain_us'] / lt['floor_us']:.2f}× ({lt['kernel']})" if lt else "—"])
        self.section(
            "GEMMs of a verify step, Llama-3-8B weights",
            "Each GEMM's share of a chain of 24 back-to-back GEMMs over their own weight copies "
            "(more than L2 holds), against (w + x + y bytes) / copy bandwidth; the best variant "
            "of each family. The verify step runs the few-row kernel up to 32 rows and cuBLASLt "
            "above (docs/architecture.md).",
            self.gpu, "gemm", doc,
            ["GEMM", "rows", "n×k", "floor µs", "few-row kernel", "cuBLASLt"], rows)

    def e2e(self):
        doc = load("e2e.json")
        if doc is None or not self.has(self.gpu, "e2e"):
            return
        b = doc["batch"]
        rows = []
        for c in (1, b):
            for mode, label in (("dflash", "speculation on (DFlash + DDTree)"),
                                ("draft_model", "speculation on (draft-model tree)"),
                                ("off", "speculation off")):
                key = f"treespec_{mode}_c{c}"
                if f"{key}_tokens_per_s" in doc:
                    same = doc.get(f"{key}_identical_to_off")
                    rows.append([f"treespec, {label}", c, f"{doc[key + '_tokens_per_s']:,.0f}",
                                 f"{doc[key + '_mean_acceptance_length']:.2f}",
                                 "—" if same is None else f"{same} of {doc.get('prompts', 12)}"])
        for key, label, c in (("hf_plain_batch1_tokens_per_s", "Transformers greedy", 1),
                              ("hf_assisted_batch1_tokens_per_s",
                               "Transformers assisted generation (same draft)", 1),
                              (f"hf_plain_batch{b}_tokens_per_s", "Transformers greedy", b)):
            if key in doc:
                rows.append([label, c, f"{doc[key]:,.0f}", "—", "—"])
        self.section(
            "End to end: the tiny pair through the services vs Transformers",
            "models/tiny-target verified, models/tiny-dflash (DDTree, "
            f"`{doc.get('dflash_spec', 'defaults')}`) or models/tiny-draft (its tree, "
            f"`{doc.get('draft_spec') or 'defaults'}`) drafting, both services on the one GPU, "
            f"as separate processes over gRPC on loopback; {doc.get('prompts', 12)} held-out "
            "prompts, 128 new tokens each, EOS ignored; Transformers runs the same checkpoints in "
            "bf16 (bench/hf_baseline.py). The tiny target (6 layers × 256) costs about what a "
            "draft does, so here speculation measures the serving path and the drafter's own "
            "cost, not the gain a large target gives. Identical = prompts whose tokens equal "
            "speculation off's: trees above 32 rows run cuBLASLt, whose sums depend on the row "
            "count, so near-ties can flip (DESIGN §3).",
            self.gpu, "e2e", None,
            ["system", "concurrency", "tok/s", "mean acceptance length", "identical to off"],
            rows)
        if "speedup_vs_hf_assisted_batch1" in doc:
            # Against speculation off too: the tiny pair's draft costs more than it saves.
            for c, peer in ((1, "speedup_vs_hf_assisted_batch1"),
                            (b, f"speedup_vs_hf_plain_batch{b}")):
                on = doc[f"treespec_draft_model_c{c}_tokens_per_s"]
                off = doc[f"treespec_off_c{c}_tokens_per_s"]
                peer_name = "Transformers assisted" if c == 1 else "Transformers greedy"
                self.figure(self.gpu, "e2e",
                            f"Tiny pair end to end, {c} concurrent, speculation on",
                            f"{on:,.0f} tok/s",
                            f"{on / off:.2f}× speculation off; {doc[peer]:.0f}× {peer_name}")

        for c in (1, b):
            if f"dflash_over_draft_model_c{c}" in doc:
                self.figure(self.gpu, "e2e", f"DFlash + DDTree vs the draft model, {c} concurrent",
                            f"{doc[f'treespec_dflash_c{c}_tokens_per_s']:,.0f} tok/s",
                            f"{doc[f'dflash_over_draft_model_c{c}']:.2f}× the draft model" +
                            (" (bar ≥ 1.25×)" if c == 1 else ""))

    def drafter(self, name, meta, title):
        doc = load(f"{name}.json")
        if doc is None or not self.has(meta, name):
            return
        rows = [[r["name"], f"{r['ms_per_step']:.3f}", f"{r['nodes_per_tree']:.1f}",
                 f"{r['tokens_per_step']:.2f}", f"{r['forwards_per_step']:.1f}"]
                for r in doc["results"]]
        self.section(
            title,
            f"Drafting latency per step (append the emitted tokens, draft the next tree): "
            f"models/tiny-draft, context {doc['context']}, tree budget {doc['tree_budget']}, "
            f"depth {doc['max_depth']}; in process and over gRPC on loopback.",
            meta, name, None, ["drafter", "ms / step", "nodes / tree", "tokens / step",
                               "forwards / step"], rows)
        exact = [r for r in doc["results"] if r["name"] == "draft_model tree (exact)"]
        if exact:
            self.figure(meta, name, f"{title.split(':')[0]}, exact tree, one session",
                        f"{exact[0]['ms_per_step']:.2f} ms / step",
                        f"{exact[0]['tokens_per_step']:.2f} tokens / step")

    def forward_cpu(self):
        doc = load("forward_cpu.json")
        if doc is None or not self.has(self.cpu, "forward"):
            return
        rows = [[r["context"], r["nodes"], f"{r['median_ms']:.3f}", f"{r['min_ms']:.3f}"]
                for r in doc]
        self.section(
            "CPU verify forward, tiny target",
            "One forward of a tree of n nodes after a committed prefix, fp32 CPU backend "
            "(the oracle), models/tiny-target; median and minimum of 30.",
            self.cpu, "forward", None, ["context", "nodes", "median ms", "min ms"], rows)

    def feature_wire(self):
        doc = load("feature_wire.json")
        if doc is None or not self.has(self.cpu, "feature_wire"):
            return
        rows = [[r["target"], r["batch"], f"{r['bytes_per_token'] / 1024:.0f}",
                 f"{r['bytes_per_step'] / 1024:,.0f}", f"{r['bytes_per_step'] * 50 / 1e6:,.0f}",
                 f"{r['commit_ms']:.3f}", f"{r['round_trip_ms']:.3f}"] for r in doc]
        self.section(
            "Target features on the drafter link",
            f"A DFlash session's commit carries the target's hidden states after the drafter's "
            f"layers for every committed token (K x H bf16 per token), tau = {doc[0]['tau']} "
            f"tokens per step per session, random rows, through the verifier's real client and a "
            f"drafter service on loopback whose drafter drafts one node. Commit = the verifier's "
            f"engine-thread time per step (pack and queue every session's commit); round trip = "
            f"first commit to the last session's tree back. MB/s = the link's load at 50 verify "
            f"steps a second.",
            self.cpu, "feature_wire", None,
            ["target (layers x hidden)", "batch", "KiB / token", "KiB / step", "MB/s at 50 steps/s",
             "commit ms", "round trip ms"], rows)

    @staticmethod
    def sweep_table(doc):
        """A sweep's header and rows: tokens/s per setting and concurrency, auto against the best
        other setting, and the step-cost model's median measured / predicted step time at each
        point (bar: within 10 %) where the sweep scraped it."""
        others = [s for s in doc["settings"] if s != "auto"]
        names = {"off": "off", "auto": "auto"}
        header = ["clients"] + [names.get(s, f"budget {s}") + " tok/s" for s in doc["settings"]]
        header += ["auto / best other", "auto τ"]
        scored = any(p.get("step_cost_ratio_median") is not None for p in doc["points"].values())
        if scored:
            header += ["step time measured / predicted (median, all settings)"]
        rows = []
        for c in doc["concurrency"]:
            p = {s: doc["points"][f"{s}_c{c}"] for s in doc["settings"]}
            row = [c] + [f"{p[s]['tokens_per_s']:,.0f}" for s in doc["settings"]]
            if "auto" in p:
                best = max(p[s]["tokens_per_s"] for s in others)
                tau = p["auto"].get("acceptance_length")
                row += [f"{p['auto']['tokens_per_s'] / best:.2f}×",
                        "–" if tau is None else f"{tau:.2f}"]
            if scored:
                ratios = [q["step_cost_ratio_median"] for q in p.values()
                          if q.get("step_cost_ratio_median") is not None]
                row.append(span(ratios) if ratios else "–")
            rows.append(row)
        return header, rows

    @staticmethod
    def rounds_note(doc):
        """How a sweep's points were taken, where each is the median of several rounds."""
        n = doc.get("rounds", 1)
        if n <= 1:
            return ""
        return (f" Each point is the median of {n} rounds (all settings of a concurrency in turn "
                "per round; auto's later rounds run on what its gate learnt in the earlier ones, "
                "as on a server that has run at that load before).")

    def concurrency_sweep(self, name, meta, title, intro):
        """A concurrency sweep (bench/concurrency_sweep.sh) as a table, and its plot
        (docs/img/NAME.svg)."""
        doc = load(f"{name}.json")
        if doc is None or not self.has(meta, name):
            return
        self.images[f"{name}.svg"] = plot_sweep.plot(doc)
        header, rows = self.sweep_table(doc)
        self.section(title, intro + self.rounds_note(doc) + f" ![plot](img/{name}.svg)", meta,
                     name, None, header, rows)

    def sweep_group(self, sweeps, meta, title, intro):
        """Several sweeps of the same settings in one table, a first column naming each
        ((label, bench) pairs), with their plots."""
        found = [(label, name, load(f"{name}.json")) for label, name in sweeps]
        found = [(label, name, doc) for label, name, doc in found
                 if doc is not None and self.has(meta, name)]
        if not found:
            return
        rows, header = [], None
        for label, name, doc in found:
            self.images[f"{name}.svg"] = plot_sweep.plot(doc)
            header, part = self.sweep_table(doc)
            rows += [[label] + r for r in part]
        plots = " ".join(f"![{label}](img/{name}.svg)" for label, name, _ in found)
        self.lines += ["", f"## {title}", "", intro + self.rounds_note(found[0][2]) + " " + plots,
                       ""]
        self.lines += table([""] + header, rows) + [""]
        for k, (_, name, _) in enumerate(found):
            self.lines += ([""] if k else []) + provenance(meta, name)

    def sweeps(self):
        bar = ("Bar (issue 34): auto ≥ 0.97× the best other setting at every concurrency, ≥ the "
               "best fixed budget at one client. auto τ = tokens per verify step with a tree.")
        self.concurrency_sweep(
            "sweep_replay_gpu", self.gpu,
            "Speculation by load: a Llama-3-8B-shaped target with a replayed drafter, one GPU",
            "Closed-loop clients through the services (treespec-loadgen), 128-token random "
            "prompts, 128 new tokens each; models/llama3-8b-shape with `--random_weights` "
            "(decisive random weights made on the GPU), the replay drafter proposing the "
            "target's recorded output with 22 % of tokens replaced (chains, depth 16: τ ≈ 4). "
            "Both services share the GPU. " + bar)
        doc = load("sweep_replay_gpu.json")
        if doc is not None and self.has(self.gpu, "sweep_replay_gpu"):
            p = doc["points"]
            self.figure(self.gpu, "sweep_replay_gpu", "Speculation (auto), 8B shape, τ ≈ 4, "
                        "one client", f"{p['auto_c1']['tokens_per_s']:,.0f} tok/s",
                        f"{p['auto_c1']['tokens_per_s'] / p['off_c1']['tokens_per_s']:.2f}× "
                        f"speculation off (bar ≥ 2.5×)")
        self.sweep_group(
            [("τ≈2", "sweep_replay_tau2_gpu"), ("τ≈6", "sweep_replay_tau6_gpu")], self.gpu,
            "Speculation by load: the 8B shape, replayed drafter at τ ≈ 2 and 6",
            "As above with 50 % (τ ≈ 2) and 13 % (τ ≈ 6) of the replayed tokens replaced. " + bar)
        self.concurrency_sweep(
            "sweep_gpu", self.gpu, "Speculation by load: the tiny pair, one GPU",
            "Closed-loop clients through the services, the held-out prompts, 64 new tokens "
            "each; models/tiny-target verified, models/tiny-draft drafting (DDTree) on the same "
            "GPU. A verify step of the tiny target (~0.2 ms) is shorter than a drafter round "
            "trip, so plain decoding is the best setting at every load. " + bar)
        self.concurrency_sweep(
            "sweep_dflash_gpu", self.gpu, "Speculation by load: the tiny pair with DFlash, one GPU",
            "As above with models/tiny-dflash drafting (one block per tree, conditioned on the "
            "target's features of every context token). " + bar)
        self.concurrency_sweep(
            "sweep_cpu", self.cpu, "Speculation by load: the tiny pair, CPU (the embedded default)",
            "As above with both services on the CPU (`--device=cpu`, the same two cores as the "
            "client), where a tree costs in proportion to its size. " + bar)

    def conversation(self, name, meta, where):
        doc = load(f"{name}.json")
        if doc is None or not self.has(meta, name):
            return
        c = doc["config"]
        modes = {"off": "off", "draft_model": "draft model", "dflash": "DFlash"}
        rows = []
        for mode, label in modes.items():
            on, off = doc["points"].get(f"{mode}_cache_on"), doc["points"].get(f"{mode}_cache_off")
            if on is None or off is None:
                continue
            share = "–" if on["reused_share"] is None else f"{100 * on['reused_share']:.1f} %"
            rows.append([label, f"{on['ttft_ms_by_turn'][0]:.0f}",
                         f"{on['mean_ttft_ms_turns_2_on']:.0f}",
                         f"{off['mean_ttft_ms_turns_2_on']:.0f}",
                         f"{on['mean_ttft_ms_turns_2_on'] / off['mean_ttft_ms_turns_2_on']:.2f}×",
                         share, f"{on['drafter_cached_tokens']:,}",
                         f"{on['output_tokens_per_s']:.0f}", f"{off['output_tokens_per_s']:.0f}"])
        self.section(
            f"Multi-turn conversations with the prefix cache, {where}",
            f"`treespec-loadgen --workload=conversation`: {c['conversations']} conversations side "
            f"by side, {c['turns']} turns each; turn 1 is {c['history_len']} tokens, each later "
            f"turn resends the history with the previous answer ({c['random_output_len']} tokens) "
            f"and {c['turn_input_len']} new tokens. Cache on/off applies to the verifier's and "
            f"the drafter's prefix caches alike, fresh services per point. TTFT is mean ms "
            f"(it includes the other conversations' prefills sharing the steps); reused = cached "
            f"tokens over what the earlier turns computed (turns >= 2); drafter cached = prompt "
            f"tokens the drafter's own cache served (the draft model's prompt tokens; DFlash: "
            f"the context rows the verifier then did not send).",
            meta, name, None,
            ["speculation", "turn 1 TTFT", "turns >= 2 TTFT, cache on", "cache off", "on / off",
             "reused", "drafter cached", "tok/s on", "tok/s off"], rows)

    def tau_sweep(self, name, meta, where):
        doc = load(f"{name}.json")
        if doc is None or not self.has(meta, name):
            return
        by = {(r["mode"], r["tree_mode"], r["budget"]): r for r in doc["rows"]}

        def cells(r):
            if r is None:
                return ["–", "–", "–"]
            ms = "–" if r["draft_ms_per_step"] is None else f"{r['draft_ms_per_step']:.2f}"
            return [f"{r['tau']:.2f}", ms, f"{r['tokens_per_s']:.0f}"]

        rows = []
        for budget in sorted({b for (_, t, b) in by if t == "tree"}):
            rows.append([f"tree of {budget}"] + cells(by.get(("dflash", "tree", budget))) +
                        cells(by.get(("draft_model", "tree", budget))))
        chains = {m: [r for (mm, t, _), r in by.items() if mm == m and t == "chain"]
                  for m in ("dflash", "draft_model")}
        if chains["dflash"] or chains["draft_model"]:
            depth = "/".join(str(chains[m][0]["budget"]) for m in chains if chains[m])
            rows.append([f"chain ({depth})"] +
                        cells(chains["dflash"][0] if chains["dflash"] else None) +
                        cells(chains["draft_model"][0] if chains["draft_model"] else None))
        self.section(
            f"Tokens per step against the tree budget: DFlash + DDTree vs the draft model, {where}",
            f"tau = tokens per verify step (the bonus counted) through the real services, greedy, "
            f"on the {doc['prompts']} held-out prompts, {doc['max_new_tokens']} new tokens each, "
            f"one request at a time: models/tiny-dflash (one forward per step, depth up to 15) "
            f"and models/tiny-draft (one forward per depth, depth 8) for models/tiny-target, "
            f"both services with --device={doc['device']}. Draft ms = the drafter's own time per "
            f"step. tau does not depend on the device (up to bf16 near-ties); the times do (both "
            f"services and the client share this machine).",
            meta, name, None,
            ["shape", "DFlash tau", "DFlash draft ms", "DFlash tok/s", "draft model tau",
             "draft model draft ms", "draft model tok/s"], rows)

    def build(self):
        self.lines = [
            "# Performance",
            "",
            "Where treespec stands today: one table per benchmark, regenerated from the JSON "
            "under `docs/bench/` by `tools/perf_report.py` (do not edit by hand; `ctest -R "
            "perf_report` fails when this page and the JSON disagree). Each table says the "
            "machine, the date, the commit and the command. How to measure again: run "
            "`tools/bench_all.sh docs/bench gpu` on a GPU machine (`RUN=.gpu/run BIN=.gpu/bin` "
            "for a gpu-bundle) and `tools/bench_all.sh docs/bench cpu` anywhere, then "
            "`tools/perf_report.py`. Every experiment, kept or not, with its measurements: "
            "[experiments/README.md](experiments/README.md). The floors are DESIGN §7's.",
        ]
        self.verify_step()
        self.verify_step("verify_step_ddtree", "Verify step at DDTree's budgets, Llama-3-8B shape",
                         " Trees of 128–512 nodes are compute-bound: the floor is the FLOP "
                         "term, and such steps run cuBLASLt (above 32 rows), not the few-row "
                         "kernel.", figures=False)
        self.attention()
        self.e2e()
        self.sweeps()
        self.drafter("drafter_gpu", self.gpu, "Drafter on the GPU: the tiny draft model")
        self.gemm()
        self.forward_cpu()
        self.drafter("drafter_cpu", self.cpu, "Drafter on the CPU: the tiny draft model")
        self.tau_sweep("tau_sweep_gpu", self.gpu, "GPU")
        self.feature_wire()
        self.tau_sweep("tau_sweep", self.cpu, "CPU")
        self.conversation("conversation_cpu", self.cpu, "CPU, the tiny pair")
        return "\n".join(self.lines) + "\n"

    def readme_table(self):
        rows = self.figures[:12]
        return "\n".join(table(["metric", "value", "vs", "machine", "date", "commit", "command"],
                               rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the pages differ from what the JSON gives")
    args = parser.parse_args()
    report = Report()
    perf = report.build()
    readme = open(README).read()
    if BEGIN not in readme or END not in readme:
        sys.exit(f"perf_report: {README} has no {BEGIN} … {END} block")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new_readme = f"{head}{BEGIN}\n{report.readme_table()}\n{END}{tail}"
    stale = []
    outputs = [(PERF, perf), (README, new_readme)]
    outputs += [(os.path.join(IMG, name), svg) for name, svg in sorted(report.images.items())]
    os.makedirs(IMG, exist_ok=True)
    for path, text in outputs:
        old = open(path).read() if os.path.exists(path) else ""
        if old != text:
            stale.append(os.path.relpath(path, ROOT))
            if not args.check:
                open(path, "w").write(text)
    if args.check and stale:
        sys.exit(f"perf_report: {', '.join(stale)} out of date with docs/bench/*.json; run "
                 "tools/perf_report.py")
    lines = perf.count("\n")
    if lines > 330:
        sys.exit(f"perf_report: docs/performance.md would be {lines} lines (at most 330)")


if __name__ == "__main__":
    main()
