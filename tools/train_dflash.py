#!/usr/bin/env python3
"""Trains a DFlash drafter (arXiv 2602.06036) for the tiny target and measures it.

Stages (each can run alone; `all` runs data, train and eval):
  check  LlamaModel (tools/train/dflash_torch.py) against Transformers' logits and greedy ids of
         the tiny pair (tests/data/model_reference.json), in fp32 on the CPU.
  data   The training data: the target's own greedy continuations. Prompts are random windows
         of the tiny pair's training corpus (tools/train/corpus.py with the tiny pair's seed: the
         same held-out files stay out) of --prompt-lens tokens, each continued greedily by the
         bf16 target for --gen-len tokens. Short continuations after real text of many lengths:
         a drafter trained deep inside long greedy continuations (which settle into loops) learns
         the loops, not the first tokens after a prompt (chain tau 13 on its training data, 1.9
         on held-out prompts). Also tokenizes the held-out files for `eval`.
  train  The drafter: every step takes --batch sequences, runs the target over them once for
         the features after --target-layers, and drafts --anchors blocks per sequence at random
         anchors from the prompt's last token on (block = [token at the anchor, MASK x (B-1)], context =
         the features of the tokens before the anchor, as a session sees them); loss = the
         cross-entropy of rows 1 .. B-1 against the sequence's next tokens, weighted
         exp(-(j-1)/--decay) by depth j. bf16 autocast, AdamW, cosine over the wall-clock budget.
  eval   On --eval-positions random points of the held-out code (context = --eval-context
         tokens, the target's greedy continuation as truth): tau (tokens per verify step, the
         bonus counted) of DFlash chain and of DFlash + DDTree at each --budgets (the tree is the
         top-budget prefixes by summed log-marginals, as drafter_service/ddtree.h builds it),
         per-depth acceptance, and the draft model's greedy chain at the same points.

The command that produced models/tiny-dflash (models/README.md has the figures), from the repo
root on the GPU machine:

    python3 tools/train_dflash.py all --minutes 4.5 --out-dir /tmp/dflash

Local checks (Debian's python3-torch, no GPU, no tokenizers: prompts come from the reference
prompts):

    /usr/bin/python3 tools/train_dflash.py check
    /usr/bin/python3 tools/train_dflash.py all --smoke --out-dir /tmp/dflash-smoke
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from train.dflash_torch import (DflashDrafter, LlamaModel, dflash_config,  # noqa: E402
                                read_safetensors, write_safetensors)

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["check", "data", "train", "eval", "all"])
    p.add_argument("--target", default="models/tiny-target")
    p.add_argument("--draft", default="models/tiny-draft", help="the draft model eval compares")
    p.add_argument("--out-dir", default="/tmp/dflash",
                   help="data.pt, the drafter (<out-dir>/<name>/) and metrics go here")
    p.add_argument("--name", default="tiny-dflash", help="the drafter's directory name")
    p.add_argument("--smoke", action="store_true", help="seconds-long run of every stage")
    p.add_argument("--seed", type=int, default=1234, help="the tiny pair's (same held-out set)")
    # data
    p.add_argument("--sequences", type=int, default=131072)
    p.add_argument("--prompt-lens", default="32,64,128,192,256,320,384,448",
                   help="real-text prompt lengths (one per generation batch, drawn at random)")
    p.add_argument("--gen-len", type=int, default=64, help="greedy tokens after each prompt")
    p.add_argument("--gen-batch", type=int, default=8192)
    p.add_argument("--corpus-mb", type=float, default=40.0, help="training files prompts come from")
    # drafter shape
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--target-layers", default="1,3,5")
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--intermediate", type=int, default=704)
    p.add_argument("--mask-token", type=int, default=4095)
    # training
    p.add_argument("--minutes", type=float, default=4.5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--anchors", type=int, default=24, help="blocks per sequence per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--decay", type=float, default=7.0, help="depth weight exp(-(j-1)/decay)")
    # eval
    p.add_argument("--eval-positions", type=int, default=2048)
    p.add_argument("--eval-context", type=int, default=192)
    p.add_argument("--budgets", default="16,32,64,128,256,512")
    args = p.parse_args(argv)
    if args.smoke:
        args.sequences, args.prompt_lens, args.gen_len, args.gen_batch = 64, "16,24", 32, 32
        args.minutes, args.batch, args.anchors, args.warmup = 0.15, 8, 4, 5
        args.eval_positions, args.eval_context = 16, 32
    return args


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------------------------------------
# check


def stage_check(args) -> dict:
    """LlamaModel in fp32 vs Transformers' logits and greedy continuations (CPU)."""
    ref = json.load(open("tests/data/model_reference.json"))
    out = {}
    for m in ref["models"]:
        if m["name"] not in ("tiny-target", "tiny-draft"):
            continue
        model = LlamaModel(m["dir"])
        worst, greedy_ok = 0.0, 0
        for case in m["cases"]:
            ids = torch.tensor([case["prompt_ids"]])
            logits, _ = model.forward(ids)
            want = torch.tensor(case["first_logits"])
            scale = want.abs().max().item()
            worst = max(worst, (logits[0, -1] - want).abs().max().item() / scale)
            got = model.greedy(ids, len(case["greedy_ids"]))[0, ids.shape[1]:].tolist()
            greedy_ok += got == case["greedy_ids"]
        out[m["name"]] = {"worst_logit_error_of_scale": worst, "greedy_equal": greedy_ok,
                          "cases": len(m["cases"])}
        log(f"check {m['name']}: worst logit error {worst:.2e} of the scale, greedy equal "
            f"{greedy_ok}/{len(m['cases'])}")
        if worst > 1e-4 or greedy_ok != len(m["cases"]):
            raise SystemExit(f"LlamaModel does not match Transformers on {m['name']}")
    return out


# ---------------------------------------------------------------------------------------------
# data


def token_streams(args):
    """(train stream, held-out stream) as int64 tensors: the corpus through the target's
    tokenizer, or in --smoke the reference prompts (no tokenizers library needed)."""
    if args.smoke:
        ref = json.load(open("tests/data/model_reference.json"))
        ids = [t for m in ref["models"][:2] for c in m["cases"] for t in c["prompt_ids"]]
        s = torch.tensor(ids)
        return s, s
    import numpy as np
    from tokenizers import Tokenizer

    from train import corpus as corpus_mod

    co = corpus_mod.discover(heldout_frac=0.02, seed=args.seed,
                             max_train_bytes=int(args.corpus_mb * 1e6))
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    train = corpus_mod.tokenize_docs(tok, [f.text for f in co.train], eos_id=0)
    held = corpus_mod.tokenize_docs(tok, [f.text for f in co.heldout], eos_id=0)
    log(f"corpus: {len(co.train)} training files ({co.train_bytes() / 1e6:.1f} MB, "
        f"{train.size / 1e6:.2f}M tokens); held out {len(co.heldout)} files "
        f"({held.size / 1e3:.1f}k tokens): {' '.join(f.rel for f in co.heldout)}")
    return (torch.from_numpy(train.astype(np.int64)), torch.from_numpy(held.astype(np.int64)))


def stage_data(args) -> dict:
    """Sequences [N, max prompt + gen_len] (zero-padded) and each one's prompt length: a
    real-text prompt, then the target's greedy continuation. Prompts of many lengths, because a
    session drafts right after real text at every position a prompt may end."""
    dev = device()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    train, held = token_streams(args)
    target = LlamaModel(args.target, dev, dtype)
    lens = [int(x) for x in args.prompt_lens.split(",")]
    L = max(lens) + args.gen_len
    gen = torch.Generator().manual_seed(args.seed + 40)
    seqs = torch.zeros(args.sequences, L, dtype=torch.int16)
    plen = torch.zeros(args.sequences, dtype=torch.int32)
    t = time.time()
    for i in range(0, args.sequences, args.gen_batch):
        n = min(args.gen_batch, args.sequences - i)
        P = lens[int(torch.randint(0, len(lens), (1,), generator=gen))]
        starts = torch.randint(0, train.numel() - P, (n,), generator=gen)
        prompts = train[starts[:, None] + torch.arange(P)].to(dev)
        seqs[i:i + n, :P + args.gen_len] = target.greedy(prompts, args.gen_len).to(torch.int16).cpu()
        plen[i:i + n] = P
    dt = time.time() - t
    n_new = args.sequences * args.gen_len
    log(f"data: {args.sequences} sequences, prompts of {lens} tokens + {args.gen_len} greedy "
        f"({n_new / 1e6:.1f}M greedy tokens) in {dt:.1f}s")
    os.makedirs(args.out_dir, exist_ok=True)
    torch.save({"seqs": seqs, "plen": plen, "gen_len": args.gen_len, "held": held.to(torch.int16)},
               os.path.join(args.out_dir, "data.pt"))
    return {"sequences": args.sequences, "prompt_lens": lens, "gen_len": args.gen_len,
            "greedy_tokens": n_new, "heldout_tokens": int(held.numel()), "seconds": round(dt, 1)}


# ---------------------------------------------------------------------------------------------
# train


def drafter_config(args, target: LlamaModel) -> dict:
    layers = [int(x) for x in args.target_layers.split(",")]
    return dflash_config(
        hidden=target.hidden, vocab=target.cfg["vocab_size"], target_layers=layers,
        n_target_layers=target.n_layers, draft_layers=args.layers, heads=args.heads,
        kv_heads=args.kv_heads, head_dim=args.head_dim, intermediate=args.intermediate,
        block_size=args.block, mask_token_id=args.mask_token, rope_theta=target.theta,
        max_positions=target.cfg["max_position_embeddings"])


def make_drafter(cfg, target: LlamaModel, dev):
    embed = target.w["model.embed_tokens.weight"].float()
    return DflashDrafter(cfg, embed, target.w["lm_head.weight"].float()).to(dev)


def block_batch(seqs, anchors, block: int, mask_id: int, L: int):
    """Block tokens/positions [S, A*B], labels [S, A, B-1] and the attention mask
    [S, A*B, L + A*B] for blocks at `anchors` [S, A] of `seqs` [S, L]."""
    S, A = anchors.shape
    dev = seqs.device
    j = torch.arange(block, device=dev)
    pos = anchors[:, :, None] + j  # [S, A, B]
    tokens = torch.full((S, A, block), mask_id, dtype=seqs.dtype, device=dev)
    tokens[:, :, 0] = torch.gather(seqs, 1, anchors)
    labels = torch.gather(seqs, 1, pos[:, :, 1:].reshape(S, -1)).view(S, A, block - 1)
    ctx = torch.arange(L, device=dev)[None, None, :] < anchors.repeat_interleave(block, 1)[:, :, None]
    blk = torch.arange(A, device=dev).repeat_interleave(block)
    own = (blk[:, None] == blk[None, :])[None].expand(S, -1, -1)
    return tokens.view(S, -1), pos.view(S, -1), labels, torch.cat([ctx, own], dim=2)


def stage_train(args) -> dict:
    dev = device()
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    data = torch.load(os.path.join(args.out_dir, "data.pt"))
    seqs = data["seqs"].to(dev).long()
    plen = data["plen"].to(dev).long()
    G, (N, L) = data["gen_len"], seqs.shape
    target = LlamaModel(args.target, dev, torch.bfloat16 if cuda else torch.float32)
    cfg = drafter_config(args, target)
    layers = cfg["dflash_config"]["target_layer_ids"]
    torch.manual_seed(args.seed + 50)
    drafter = make_drafter(cfg, target, dev)
    n_params = sum(p.numel() for p in drafter.parameters())
    decay = [p for p in drafter.parameters() if p.dim() == 2]
    other = [p for p in drafter.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), **({"fused": True} if cuda else {}))
    B, A = args.block, args.anchors
    weights = torch.exp(-torch.arange(B - 1, device=dev, dtype=torch.float32) / args.decay)
    gen = torch.Generator(device=dev).manual_seed(args.seed + 51)
    budget = args.minutes * 60
    log(f"train {args.name}: {n_params} params, {args.layers} layers, target layers {layers}, "
        f"block {B}; {N} sequences of {L}; {budget:.0f}s")
    step, t_start, hist = 0, time.time(), []
    if G < B:
        raise SystemExit(f"--gen-len {G} is shorter than the block {B}")
    while True:
        elapsed = time.time() - t_start
        if elapsed >= budget:
            break
        frac = elapsed / budget
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, N, (args.batch,), device=dev, generator=gen)
        x = seqs[idx]
        # Anchors from the prompt's last token on, while the block's labels are greedy tokens.
        offsets = torch.randint(0, G - B + 2, (args.batch, A), device=dev, generator=gen)
        anchors = plen[idx][:, None] - 1 + offsets
        tokens, pos, labels, mask = block_batch(x, anchors, B, cfg["dflash_config"]["mask_token_id"], L)
        _, feats = target.forward(x, feature_layers=layers, logits=False)
        ctx_pos = torch.arange(L, device=dev)[None].expand(args.batch, L)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            h = drafter(feats.float(), ctx_pos, tokens, pos, mask)
            h = h.view(args.batch, A, B, -1)[:, :, 1:]
            logits = drafter.logits(h).float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                             reduction="none").view(args.batch, A, B - 1)
        loss = (ce * weights).sum(-1).mean() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 200 == 0 or step == 1:
            acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
            run = (logits.argmax(-1) == labels).int().cumprod(-1).sum(-1).float().mean() + 1
            hist.append({"step": step, "seconds": round(time.time() - t_start, 1),
                         "loss": round(loss.item(), 4), "chain_tau": round(run.item(), 3)})
            log(f"{args.name} step {step}: loss {loss.item():.4f} lr {lr:.2e} chain tau "
                f"{run.item():.3f} acc d1 {acc[0].item():.3f} d4 {acc[3].item():.3f} "
                f"d8 {acc[min(7, B - 2)].item():.3f}")
    dt = time.time() - t_start
    out = os.path.join(args.out_dir, args.name)
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), drafter.tensors())
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    log(f"saved {out}: {step} steps in {dt:.0f}s")
    return {"params": n_params, "steps": step, "seconds": round(dt, 1),
            "sequences_drawn": step * args.batch,
            "blocks_trained": step * args.batch * A, "history": hist, "config": cfg}


# ---------------------------------------------------------------------------------------------
# eval


def ddtree_accepted(logprobs, ranks, budgets):
    """Accepted depth for each budget of the top-budget-prefix tree (drafter_service/ddtree.h)
    over per-depth ranked log-probs [D][k], where the truth's rank at each depth is ranks[d]
    (-1 when not in the top k). Pops prefixes best-first; a node is on the truth's path when its
    parent is and its rank is the truth's."""
    D, k = len(logprobs), len(logprobs[0])
    max_b = max(budgets)
    # (-score, tie order, depth, rank, parent on the path)
    heap = [(-logprobs[0][0], 0, 0, 0, True)]
    seq, popped, pop_at_depth = 1, 0, {}
    while heap and popped < max_b:
        neg, _, d, r, parent_on = heapq.heappop(heap)
        on = parent_on and ranks[d] == r
        if on:
            pop_at_depth[d] = popped
        popped += 1
        if r + 1 < k:  # the next sibling
            heapq.heappush(heap, (neg + logprobs[d][r] - logprobs[d][r + 1], seq, d, r + 1,
                                  parent_on))
            seq += 1
        if d + 1 < D:  # the first child
            heapq.heappush(heap, (neg - logprobs[d + 1][0], seq, d + 1, 0, on))
            seq += 1
    out = {}
    for b in budgets:
        depth = 0
        while depth in pop_at_depth and pop_at_depth[depth] < b:
            depth += 1
        out[b] = depth
    return out


def stage_eval(args) -> dict:
    dev = device()
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    held = torch.load(os.path.join(args.out_dir, "data.pt"))["held"].long()
    target = LlamaModel(args.target, dev, dtype)
    draft = LlamaModel(args.draft, dev, dtype)
    ddir = os.path.join(args.out_dir, args.name)
    cfg = json.load(open(os.path.join(ddir, "config.json")))
    drafter = make_drafter(cfg, target, dev)
    drafter.load({k: v.to(dev) for k, v in
                  read_safetensors(os.path.join(ddir, "model.safetensors")).items()})
    drafter = drafter.to(dtype)
    layers = cfg["dflash_config"]["target_layer_ids"]
    B, mask_id = cfg["block_size"], cfg["dflash_config"]["mask_token_id"]
    D, C = B - 1, args.eval_context
    budgets = [int(b) for b in args.budgets.split(",")]
    gen = torch.Generator().manual_seed(args.seed + 99)
    n = min(args.eval_positions, held.numel() - C)
    pos = torch.randint(C - 1, held.numel(), (n,), generator=gen)
    ctx = held[pos[:, None] - (C - 1) + torch.arange(C)].to(dev)
    k = min(max(budgets), cfg["vocab_size"])
    chain, tree, draft_matched = [], {b: [] for b in budgets}, []
    t_draft = 0.0
    with torch.no_grad():
        for i in range(0, n, 256):
            c = ctx[i:i + 256]
            S = c.shape[0]
            seq = target.greedy(c, D + 1)  # [S, C + D + 1]: g1 (the bonus) .. g(D+1)
            truth = seq[:, C + 1:]
            _, feats = target.forward(c, feature_layers=layers, logits=False)
            tokens = torch.full((S, B), mask_id, device=dev, dtype=torch.long)
            tokens[:, 0] = seq[:, C]
            t = time.time()
            h = drafter(feats, torch.arange(C, device=dev)[None].expand(S, C), tokens,
                        (C + torch.arange(B, device=dev))[None].expand(S, B),
                        torch.ones(S, B, C + B, dtype=torch.bool, device=dev))
            lp = torch.log_softmax(drafter.logits(h[:, 1:]).float(), dim=-1)  # [S, D, V]
            if cuda:
                torch.cuda.synchronize()
            t_draft += time.time() - t
            top = lp.topk(k, dim=-1)
            chain.append((top.indices[:, :, 0] == truth).int().cumprod(-1).sum(-1).cpu())
            hit = top.indices == truth[:, :, None]
            ranks = torch.where(hit.any(-1), hit.int().argmax(-1), -1).cpu().tolist()
            values = top.values.cpu().tolist()
            for s in range(S):
                acc = ddtree_accepted(values[s], ranks[s], budgets)
                for b in budgets:
                    tree[b].append(acc[b])
            # The draft model's greedy chain, teacher-forced on the truth: one forward gives
            # every depth's proposal once the earlier ones matched.
            dl, _ = draft.forward(seq[:, :-1])
            proposal = dl[:, C:].float().argmax(-1)
            draft_matched.append((proposal == truth).int().cumprod(-1).sum(-1).cpu())
    chain = torch.cat(chain).float()
    draft_matched = torch.cat(draft_matched).float()
    per_depth = [(chain >= d).float().mean().item() for d in range(1, D + 1)]
    res = {
        "positions": n, "context": C, "block": B,
        "dflash_chain_tau": (chain + 1).mean().item(),
        "dflash_chain_accept_by_depth": [round(x, 4) for x in per_depth],
        "dflash_ddtree_tau": {str(b): 1 + sum(tree[b]) / n for b in budgets},
        "draft_model_chain_tau": {str(d): (draft_matched.clamp(max=d) + 1).mean().item()
                                  for d in (4, 8, D)},
        "draft_model_chain_accept_by_depth": [round((draft_matched >= d).float().mean().item(), 4)
                                              for d in range(1, D + 1)],
        "dflash_forward_ms_per_256_blocks": round(1e3 * t_draft / math.ceil(n / 256), 2),
    }
    log(f"eval {args.name}: DFlash chain tau {res['dflash_chain_tau']:.3f}; DDTree tau " +
        " ".join(f"{b}:{v:.3f}" for b, v in res["dflash_ddtree_tau"].items()) +
        "; draft model chain tau " +
        " ".join(f"{d}:{v:.3f}" for d, v in res["draft_model_chain_tau"].items()))
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    metrics_path = os.path.join(args.out_dir, f"{args.name}.metrics.json")
    metrics = {"args": vars(args), "torch": torch.__version__,
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    if os.path.exists(metrics_path):
        metrics.update({k: v for k, v in json.load(open(metrics_path)).items()
                        if k not in ("args",)})
    if args.stage == "check":
        metrics["check"] = stage_check(args)
    if args.stage in ("data", "all"):
        metrics["data"] = stage_data(args)
    if args.stage in ("train", "all"):
        metrics["train"] = stage_train(args)
    if args.stage in ("eval", "all"):
        metrics["eval"] = stage_eval(args)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(metrics_path, "w") as f:
        json.dump(metrics, f, indent=1)
    log(f"done; metrics in {metrics_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
