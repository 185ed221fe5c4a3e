#!/usr/bin/env python3
"""Trains treespec's embedded tiny target + draft pair and writes the reference vectors.

What it does (DESIGN.md §5):
  1. Corpus: every Python source of the running interpreter (standard library + the
     site-packages of its environment). A seeded ~2 % of standard-library modules is held out.
  2. Tokenizer: byte-level BPE, 4096 entries, `<|endoftext|>` = id 0 (BOS, EOS, separator).
  3. Target: Llama, 6 layers x 256, 8 q / 4 kv heads (head_dim 32), MLP 704, tied embeddings,
     trained from scratch (bf16 autocast, fused AdamW, cosine schedule over wall-clock time).
  4. Draft: Llama, 2 layers x 128, 4 q / 2 kv heads, MLP 352, tied, distilled from the target:
     loss = 0.7 * KL(target || draft) + 0.3 * CE.
  5. Measures on held-out standard-library code: target loss / perplexity, draft top-1 / top-4
     agreement with the target's argmax, and the mean accepted length of a greedy draft chain of
     depth 4 and 8 (bonus token included).
  6. Saves both as Hugging Face LlamaForCausalLM checkpoints in bfloat16 under
     <out-dir>/models/tiny-{target,draft}/ and writes the reference vectors under
     <out-dir>/tests/data/ (tools/train/references.py; computed on the CPU in float32).

Needs torch, transformers, tokenizers, safetensors and a CUDA GPU; nothing in CI runs it.

The command that produced models/ (on one H200, through the device tool, from the repo root):

    PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
        python3 tools/train_tiny_pair.py --out-dir . --minutes-target 3 --minutes-draft 2

(torch 2.11.0+cu130, transformers 5.17.0, tokenizers 0.23.2; 357 s in all; models/README.md
has the measured figures.)

A quick end-to-end check of the pipeline (tiny corpus, seconds of training):

    PYTHONUNBUFFERED=1 python3 tools/train_tiny_pair.py --smoke --out-dir /tmp/smoke

Only the references, from checkpoints already under <out-dir>/models (CPU only):

    python3 tools/train_tiny_pair.py --stage refs --out-dir .
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train import corpus as corpus_mod  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default=".", help="root under which models/ and tests/data/ go")
    p.add_argument("--stage", choices=["all", "train", "refs"], default="all")
    p.add_argument("--smoke", action="store_true",
                   help="fast end-to-end check: small corpus, seconds of training")
    p.add_argument("--minutes-target", type=float, default=3.0)
    p.add_argument("--minutes-draft", type=float, default=2.0)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=256, help="sequences per step")
    p.add_argument("--lr-target", type=float, default=3e-3)
    p.add_argument("--lr-draft", type=float, default=4e-3)
    p.add_argument("--warmup-steps", type=int, default=150)
    p.add_argument("--kl-weight", type=float, default=0.7)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--tokenizer-sample-mb", type=float, default=32.0)
    p.add_argument("--max-corpus-mb", type=float, default=0.0, help="0 = everything")
    p.add_argument("--heldout-frac", type=float, default=0.02)
    p.add_argument("--chain-positions", type=int, default=4096)
    p.add_argument("--chain-context", type=int, default=192)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--metrics-json", default=os.path.join(os.environ.get("OUT", "/tmp"),
                                                          "train_metrics.json"))
    args = p.parse_args(argv)
    if args.smoke:
        args.minutes_target = min(args.minutes_target, 0.25)
        args.minutes_draft = min(args.minutes_draft, 0.2)
        args.max_corpus_mb = args.max_corpus_mb or 16.0
        args.tokenizer_sample_mb = min(args.tokenizer_sample_mb, 2.0)
        args.chain_positions = min(args.chain_positions, 256)
        args.warmup_steps = min(args.warmup_steps, 10)
    return args


# ---------------------------------------------------------------------------------------------
# Models


def target_config_kwargs(vocab: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=6,
                num_attention_heads=8, num_key_value_heads=4, head_dim=32)


def draft_config_kwargs(vocab: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def make_llama_config(shape: dict):
    from transformers import LlamaConfig
    from train.hf_compat import make_config

    return make_config(
        LlamaConfig, rope_theta=10000.0, rope_scaling=None,
        hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=None,
        attention_bias=False, mlp_bias=False, initializer_range=0.02, use_cache=True, **shape)


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


# ---------------------------------------------------------------------------------------------
# Training


def train_model(model, data, args, minutes: float, peak_lr: float, seed: int, name: str,
                teacher=None, after_step=None):
    """Trains on random windows of `data` (int32 tensor on the GPU) for `minutes` of wall clock.
    The learning rate warms up linearly for warmup_steps, then follows a cosine over the elapsed
    fraction of the time budget down to 10 % of the peak. `after_step()`, when given, runs after
    every optimizer step (updates outside the gradient, e.g. router biases)."""
    import torch
    import torch.nn.functional as F

    dev = data.device
    T, B = args.seq_len, args.batch
    V = model.config.vocab_size
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    ar = torch.arange(T + 1, device=dev)
    budget = minutes * 60.0
    min_lr = 0.1 * peak_lr
    n_tokens = data.numel()
    step, t_start, elapsed = 0, None, 0.0
    ema = None
    model.train()
    history = []
    while True:
        if t_start is not None:
            elapsed = time.time() - t_start
            if elapsed >= budget:
                break
        if step < args.warmup_steps:
            lr = peak_lr * (step + 1) / args.warmup_steps
        else:
            frac = min(1.0, elapsed / budget)
            lr = min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * frac))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n_tokens - T - 1, (B,), device=dev, generator=gen)
        batch = data[starts[:, None] + ar].long()
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        logits = logits.float().reshape(-1, V)
        ce = F.cross_entropy(logits, y.reshape(-1))
        if teacher is not None:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                tlogits = teacher(input_ids=x, use_cache=False).logits
            logp_t = F.log_softmax(tlogits.float().reshape(-1, V), dim=-1)
            logp_d = F.log_softmax(logits, dim=-1)
            kl = (logp_t.exp() * (logp_t - logp_d)).sum(-1).mean()
            loss = args.kl_weight * kl + (1.0 - args.kl_weight) * ce
        else:
            kl = None
            loss = ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if after_step is not None:
            after_step()
        step += 1
        if step == 1:
            torch.cuda.synchronize()
            t_start = time.time()
            log(f"{name}: first step done (lr warmup {args.warmup_steps} steps, "
                f"budget {budget:.0f}s, {B}x{T} tokens/step)")
        if step % 100 == 0 or step in (10, 30):
            ce_v = ce.item()
            kl_v = kl.item() if kl is not None else float("nan")
            ema = ce_v if ema is None else 0.9 * ema + 0.1 * ce_v
            el = time.time() - t_start
            tok_s = (step - 1) * B * T / max(el, 1e-9)
            history.append({"step": step, "elapsed_s": round(el, 1), "ce": ce_v, "kl": kl_v,
                            "lr": lr})
            log(f"{name}: step {step:5d} ce {ce_v:.4f} kl {kl_v:.4f} lr {lr:.2e} "
                f"{tok_s / 1e6:.2f} Mtok/s")
    torch.cuda.synchronize()
    el = time.time() - t_start
    info = {"steps": step, "seconds": round(el, 1), "tokens": step * B * T,
            "tokens_per_s": round((step - 1) * B * T / max(el, 1e-9)),
            "final_ce": ce.item(), "final_kl": (kl.item() if kl is not None else None),
            "peak_lr": peak_lr, "batch": B, "seq_len": T,
            "max_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "history": history}
    log(f"{name}: done: {step} steps, {info['tokens'] / 1e6:.1f}M tokens in {el:.0f}s, "
        f"final ce {info['final_ce']:.4f}, max mem {info['max_mem_gib']} GiB")
    model.eval()
    return info


# ---------------------------------------------------------------------------------------------
# Evaluation on held-out code


def evaluate(target, draft, stream, args):
    """stream: int32 tensor on the GPU (held-out tokens, documents separated by EOS)."""
    import torch
    import torch.nn.functional as F

    dev = stream.device
    T = args.seq_len
    V = target.config.vocab_size
    n_win = (stream.numel() - 1) // T
    X = stream[: n_win * T].view(n_win, T).long()
    Y = stream[1: n_win * T + 1].view(n_win, T).long()
    sums = dict(ce_t=0.0, ce_d=0.0, top1=0, top4=0, acc_t=0, acc_d=0, n=0)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(0, n_win, 64):
            x, y = X[i:i + 64], Y[i:i + 64]
            lt = target(input_ids=x, use_cache=False).logits.float()
            sums["ce_t"] += F.cross_entropy(lt.reshape(-1, V), y.reshape(-1),
                                            reduction="sum").item()
            ta = lt.argmax(-1)
            sums["acc_t"] += (ta == y).sum().item()
            if draft is not None:
                ld = draft(input_ids=x, use_cache=False).logits.float()
                sums["ce_d"] += F.cross_entropy(ld.reshape(-1, V), y.reshape(-1),
                                                reduction="sum").item()
                top4 = ld.topk(4, dim=-1).indices
                sums["top1"] += (top4[..., 0] == ta).sum().item()
                sums["top4"] += (top4 == ta[..., None]).any(-1).sum().item()
                sums["acc_d"] += (top4[..., 0] == y).sum().item()
            sums["n"] += y.numel()
    n = sums["n"]
    res = {"heldout_tokens_scored": n,
           "target_loss": sums["ce_t"] / n, "target_ppl": math.exp(sums["ce_t"] / n),
           "target_next_token_acc": sums["acc_t"] / n}
    if draft is None:
        return res
    res.update({"draft_loss": sums["ce_d"] / n, "draft_ppl": math.exp(sums["ce_d"] / n),
                "draft_next_token_acc": sums["acc_d"] / n,
                "draft_top1_agree": sums["top1"] / n, "draft_top4_agree": sums["top4"] / n})

    # Greedy chain: from a context of the held-out text, the target's greedy continuation
    # g1..gD (full recompute) and the draft's greedy chain. The draft's i-th proposal, once
    # d1..d(i-1) matched, is its argmax after context + g1..g(i-1), so one draft forward over
    # context + g gives every proposal. Accepted = matched prefix (<= depth) + 1 bonus token.
    C, D = args.chain_context, 8
    hi = stream.numel() - 1
    gen = torch.Generator(device="cpu")
    gen.manual_seed(args.seed + 99)
    n_pos = min(args.chain_positions, max(1, hi - C))
    pos = torch.randint(C - 1, hi, (n_pos,), generator=gen).to(dev)
    ctx = stream[pos[:, None] - (C - 1) + torch.arange(C, device=dev)].long()
    matched = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(0, n_pos, 512):
            seq = ctx[i:i + 512]
            for _ in range(D):
                nxt = target(input_ids=seq, use_cache=False).logits[:, -1].float().argmax(-1)
                seq = torch.cat([seq, nxt[:, None]], dim=1)
            dl = draft(input_ids=seq[:, :-1], use_cache=False).logits[:, C - 1:].float()
            match = (dl.argmax(-1) == seq[:, C:]).int()
            matched.append(match.cumprod(dim=1).sum(dim=1))
    matched = torch.cat(matched).float()
    for depth in (1, 2, 4, 8):
        res[f"chain_accept_depth{depth}"] = (matched.clamp(max=depth) + 1).mean().item()
    res["chain_positions"] = n_pos
    res["chain_context"] = C
    hist = torch.bincount(matched.long(), minlength=D + 1).tolist()
    res["chain_matched_hist_depth8"] = hist
    return res


# ---------------------------------------------------------------------------------------------
# Saving


def save_tokenizer(tok, model_dir: str) -> None:
    """tokenizer.json as the `tokenizers` library writes it, plus the Transformers side files."""
    os.makedirs(model_dir, exist_ok=True)
    eot = corpus_mod.EOT
    try:
        from transformers import PreTrainedTokenizerFast

        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot,
                                         model_max_length=2048,
                                         clean_up_tokenization_spaces=False)
        hf_tok.save_pretrained(model_dir)
    except Exception as e:  # noqa: BLE001 - side files only; tokenizer.json is what matters
        log(f"WARNING: PreTrainedTokenizerFast.save_pretrained failed ({e!r}); "
            "writing tokenizer_config.json by hand")
        with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as fh:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eot,
                       "eos_token": eot, "model_max_length": 2048,
                       "clean_up_tokenization_spaces": False}, fh, indent=2)
    # The file the C++ side parses: exactly what `tokenizers` writes.
    tok.save(os.path.join(model_dir, "tokenizer.json"), pretty=True)


def save_model(model, model_dir: str, tok) -> dict:
    import torch
    from train.hf_compat import finalize_config_json, save_pretrained_safetensors

    os.makedirs(model_dir, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16).cpu()
    m.generation_config.bos_token_id = 0
    m.generation_config.eos_token_id = 0
    save_pretrained_safetensors(m, model_dir)
    finalize_config_json(model_dir, m.config, dtype="bfloat16", rope_theta=10000.0,
                         rope_scaling=None)
    save_tokenizer(tok, model_dir)
    return check_saved(model_dir, expect_tied=True)


def check_saved(model_dir: str, expect_tied: bool) -> dict:
    """Reloads with Transformers and checks the config fields the C++ loader relies on."""
    import torch
    from transformers import AutoModelForCausalLM

    with open(os.path.join(model_dir, "config.json")) as fh:
        cfg = json.load(fh)
    problems = []
    want = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
            "tie_word_embeddings": expect_tied, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "rope_scaling": None, "torch_dtype": "bfloat16"}
    for k, v in want.items():
        if cfg.get(k, "<missing>") != v:
            problems.append(f"{k}={cfg.get(k, '<missing>')!r} (want {v!r})")
    m = AutoModelForCausalLM.from_pretrained(model_dir)
    dt = next(m.parameters()).dtype
    files = sorted(os.listdir(model_dir))
    sizes = {f: os.path.getsize(os.path.join(model_dir, f)) for f in files}
    log(f"saved {model_dir}: {sizes}; reloads as {type(m).__name__} {dt}, "
        f"{count_params(m)} params; config problems: {problems or 'none'}")
    if problems:
        raise RuntimeError(f"{model_dir}/config.json: {problems}")
    del m
    try:  # Transformers' tokenizer over the same files gives the same ids?
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        probe = "def f(x):\n\treturn x  # café 🎉<|endoftext|>"
        want = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json")).encode(
            probe, add_special_tokens=False).ids
        got = AutoTokenizer.from_pretrained(model_dir).encode(probe, add_special_tokens=False)
        log(f"AutoTokenizer agrees with tokenizers: {got == want}")
    except Exception as e:  # noqa: BLE001 - informational
        log(f"WARNING: AutoTokenizer check failed: {e!r}")
    return sizes


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    out_dir = os.path.abspath(args.out_dir)
    models_dir = os.path.join(out_dir, "models")
    target_dir = os.path.join(models_dir, "tiny-target")
    draft_dir = os.path.join(models_dir, "tiny-draft")

    import numpy as np
    import tokenizers
    import torch
    import transformers

    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                "numpy": np.__version__}
    try:
        import safetensors
        versions["safetensors"] = safetensors.__version__
    except Exception:  # noqa: BLE001
        pass
    log(f"versions: {versions}; cuda: {torch.cuda.is_available()} "
        f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}; "
        f"cpus: {os.cpu_count()}; args: {vars(args)}")
    metrics = {"versions": versions, "args": vars(args),
               "date": datetime.date.today().isoformat()}

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    if args.stage in ("all", "train"):
        if not torch.cuda.is_available():
            raise SystemExit("training needs a CUDA GPU")
        torch.set_float32_matmul_precision("high")
        dev = torch.device("cuda")

        # --- corpus
        t = time.time()
        co = corpus_mod.discover(heldout_frac=args.heldout_frac, seed=args.seed,
                                 max_train_bytes=int(args.max_corpus_mb * 1e6))
        log(f"corpus: stdlib {co.stdlib_root} ({co.n_stdlib_files} files), site {co.site_roots} "
            f"({co.n_site_files} files); {co.n_duplicates} duplicates, {co.n_unreadable} "
            f"unreadable/empty skipped; all training files {co.uncapped_train_bytes / 1e6:.1f} MB; "
            f"train {len(co.train)} files "
            f"{co.train_bytes() / 1e6:.1f} MB, held out {len(co.heldout)} files "
            f"{co.heldout_bytes() / 1e6:.2f} MB ({time.time() - t:.1f}s)")
        log("held out: " + " ".join(f.rel for f in co.heldout))
        metrics["corpus"] = {"stdlib_root": co.stdlib_root, "site_roots": co.site_roots,
                             "train_files": len(co.train), "train_bytes": co.train_bytes(),
                             "heldout_files": [f.rel for f in co.heldout],
                             "heldout_bytes": co.heldout_bytes()}

        # --- tokenizer
        t = time.time()
        rng = random.Random(args.seed + 2)
        order = list(range(len(co.train)))
        rng.shuffle(order)
        sample, total = [], 0
        for i in order:
            if total >= args.tokenizer_sample_mb * 1e6:
                break
            sample.append(co.train[i].text)
            total += len(co.train[i].text)
        tok = corpus_mod.train_tokenizer(iter(sample), vocab_size=args.vocab)
        log(f"tokenizer: trained on {len(sample)} files / {total / 1e6:.1f}M chars in "
            f"{time.time() - t:.1f}s; vocab {tok.get_vocab_size()}")
        save_tokenizer(tok, target_dir)
        save_tokenizer(tok, draft_dir)

        # --- tokenize
        t = time.time()
        train_ids = corpus_mod.tokenize_docs(tok, [f.text for f in co.train], eos_id=0)
        held_ids = corpus_mod.tokenize_docs(tok, [f.text for f in co.heldout], eos_id=0)
        dt = time.time() - t
        log(f"tokenized: train {train_ids.size / 1e6:.2f}M tokens "
            f"({co.train_bytes() / train_ids.size:.2f} bytes/token), held out "
            f"{held_ids.size / 1e3:.1f}k tokens, in {dt:.1f}s "
            f"({(co.train_bytes() + co.heldout_bytes()) / 1e6 / dt:.1f} MB/s)")
        metrics["corpus"].update({"train_tokens": int(train_ids.size),
                                  "heldout_tokens": int(held_ids.size),
                                  "tokenize_seconds": round(dt, 1)})
        data = torch.from_numpy(train_ids.astype(np.int32)).to(dev)
        held = torch.from_numpy(held_ids.astype(np.int32)).to(dev)
        del co, sample

        from transformers import LlamaForCausalLM

        # --- target
        torch.manual_seed(args.seed + 10)
        target = LlamaForCausalLM(make_llama_config(target_config_kwargs(args.vocab))).to(dev)
        log(f"target: {count_params(target)} params, attn "
            f"{getattr(target.config, '_attn_implementation', '?')}")
        metrics["target_train"] = train_model(target, data, args, args.minutes_target,
                                              args.lr_target, args.seed + 11, "target")
        target = target.to(torch.bfloat16)  # what ships; the draft learns from this one
        metrics["target_eval"] = evaluate(target, None, held, args)
        log(f"target held-out: {json.dumps(metrics['target_eval'])}")
        metrics["target_params"] = count_params(target)
        metrics["target_files"] = save_model(target, target_dir, tok)

        # --- draft
        torch.manual_seed(args.seed + 20)
        draft = LlamaForCausalLM(make_llama_config(draft_config_kwargs(args.vocab))).to(dev)
        log(f"draft: {count_params(draft)} params")
        metrics["draft_train"] = train_model(draft, data, args, args.minutes_draft,
                                             args.lr_draft, args.seed + 21, "draft",
                                             teacher=target)
        draft = draft.to(torch.bfloat16)
        metrics["eval"] = evaluate(target, draft, held, args)
        ev = metrics["eval"]
        log("HELD-OUT: target loss {:.4f} (ppl {:.2f}, next-token acc {:.3f}); draft loss {:.4f}; "
            "draft top-1 agree {:.3f}, top-4 agree {:.3f}; greedy chain accept depth4 {:.3f} "
            "depth8 {:.3f} (bonus incl.)".format(
                ev["target_loss"], ev["target_ppl"], ev["target_next_token_acc"],
                ev["draft_loss"], ev["draft_top1_agree"], ev["draft_top4_agree"],
                ev["chain_accept_depth4"], ev["chain_accept_depth8"]))

        # --- save
        metrics["draft_params"] = count_params(draft)
        metrics["draft_files"] = save_model(draft, draft_dir, tok)
        del data, held, target, draft
        torch.cuda.empty_cache()

    if args.stage in ("all", "refs"):
        from train import references

        metrics["references"] = references.write_all(out_dir, args, log)

    metrics["total_seconds"] = round(time.time() - T0, 1)
    if args.metrics_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.metrics_json)), exist_ok=True)
        with open(args.metrics_json, "w") as fh:
            json.dump(metrics, fh, indent=2)
    log(f"all done in {metrics['total_seconds']}s; metrics in {args.metrics_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
