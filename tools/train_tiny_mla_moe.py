#!/usr/bin/env python3
"""Trains the embedded tiny MLA + MoE target (DeepSeek-V3's blocks) on the tiny pair's corpus.

It ships as models/tiny-mla-moe/: a Hugging Face DeepseekV3ForCausalLM checkpoint (bf16) with
the shipped tokenizer (models/tiny-target/tokenizer.json, copied), so the shipped draft model
(models/tiny-draft) and the ngram drafter draft for it and acceptance is real. Same corpus,
windows, optimizer and schedule as tools/train_tiny_pair.py (whose functions it uses); only the
model differs:

  4 layers x 256, 8 heads; MLA with q_lora_rank 128, kv_lora_rank 64, qk_nope_head_dim 32,
  qk_rope_head_dim 16, v_head_dim 32 (a 80-value latent per token); layer 0 a dense MLP of 704,
  layers 1-3 MoE: 16 experts of 128 in 4 groups (2 kept), 2 per token, 1 shared expert,
  sigmoid router with a score-correction bias, routed_scaling_factor 2.5; YaRN-free RoPE with
  rope_interleave; tied embeddings. About 7.4 M parameters, ~15 MB in bf16.

The router's e_score_correction_bias is a buffer DeepSeek-V3 updates outside the gradient to
balance the experts; here it is nudged the same way after every step (+/- `--bias-rate` by
whether an expert took less or more than its share of the step's tokens), so the experts stay
in use and the bias the checkpoint ships is a trained one.

Needs torch, transformers, tokenizers, safetensors and a CUDA GPU; nothing in CI runs it.
From the repo root, on the GPU machine:

    PYTHONUNBUFFERED=1 python3 tools/train_tiny_mla_moe.py --out-dir . --minutes 4

It prints the held-out loss and the shipped draft model's greedy-chain acceptance against the
new target (the figures models/README.md records), and writes models/tiny-mla-moe/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_tiny_pair as pair  # noqa: E402
from train import corpus as corpus_mod  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default=".", help="repository root (models/ is read and written)")
    p.add_argument("--minutes", type=float, default=4.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--bias-rate", type=float, default=1e-3)
    p.add_argument("--smoke", action="store_true", help="small corpus, seconds of training")
    # The tiny pair's data and evaluation settings (train_tiny_pair.parse_args defaults).
    args, rest = p.parse_known_args(argv)
    base = pair.parse_args(rest + (["--smoke"] if args.smoke else []))
    for k, v in vars(args).items():
        setattr(base, k, v)
    if args.smoke:
        base.minutes = min(base.minutes, 0.25)
    return base


def config(vocab: int):
    from transformers import DeepseekV3Config
    from train.hf_compat import make_config

    return make_config(
        DeepseekV3Config, rope_theta=10000.0, rope_scaling=None,
        vocab_size=vocab, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, q_lora_rank=128, kv_lora_rank=64,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, rope_interleave=True,
        first_k_dense_replace=1, n_routed_experts=16, n_shared_experts=1,
        num_experts_per_tok=2, moe_intermediate_size=128, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True, hidden_act="silu",
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True,
        attention_bias=False, bos_token_id=0, eos_token_id=0, pad_token_id=None,
        initializer_range=0.02, use_cache=True)


def balance_biases(rate: float, counts: dict) -> None:
    """Moves each router's score bias toward equal expert load (DeepSeek-V3's aux-loss-free
    balancing): up for experts under their share of the step's tokens, down for those over."""
    import torch

    for entry in counts.values():
        load = entry["count"]
        share = load.sum() / load.numel()
        with torch.no_grad():
            entry["tensor"].add_(rate * torch.sign(share - load))
        load.zero_()


def attach_load_counters(model, top_k: int) -> dict:
    """Counts, per router, how many tokens chose each expert (forward hooks on the routers)."""
    import torch

    counts = {}
    for name, module in model.named_modules():
        if type(module).__name__.endswith("TopkRouter"):
            bias = module.e_score_correction_bias
            entry = {"tensor": bias, "count": torch.zeros_like(bias)}
            counts[name] = entry

            def hook(mod, inputs, output, entry=entry):
                indices = output[0] if isinstance(output, tuple) else None
                if indices is None or indices.dtype not in (torch.int64, torch.int32):
                    # Transformers versions whose router returns logits: route here.
                    logits = output[0] if isinstance(output, tuple) else output
                    scores = logits.float().sigmoid() + mod.e_score_correction_bias
                    indices = scores.topk(top_k, dim=-1).indices
                entry["count"] += torch.bincount(indices.reshape(-1),
                                                 minlength=entry["count"].numel()).float()

            module.register_forward_hook(hook)
    return counts


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    if not torch.cuda.is_available():
        raise SystemExit("training needs a CUDA GPU")
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    out = os.path.abspath(args.out_dir)
    shipped = os.path.join(out, "models", "tiny-target")
    target_dir = os.path.join(out, "models", "tiny-mla-moe")

    co = corpus_mod.discover(heldout_frac=args.heldout_frac, seed=args.seed,
                             max_train_bytes=int(args.max_corpus_mb * 1e6))
    tok = Tokenizer.from_file(os.path.join(shipped, "tokenizer.json"))
    train_ids = corpus_mod.tokenize_docs(tok, [f.text for f in co.train], eos_id=0)
    held_ids = corpus_mod.tokenize_docs(tok, [f.text for f in co.heldout], eos_id=0)
    pair.log(f"corpus: {train_ids.size / 1e6:.1f}M train tokens, {held_ids.size / 1e3:.0f}k "
             f"held out ({len(co.heldout)} files)")
    data = torch.from_numpy(train_ids.astype(np.int32)).to(dev)
    held = torch.from_numpy(held_ids.astype(np.int32)).to(dev)

    model = AutoModelForCausalLM.from_config(config(tok.get_vocab_size())).to(dev)
    pair.log(f"tiny MLA + MoE target: {pair.count_params(model)} params")
    counts = attach_load_counters(model, model.config.num_experts_per_tok)
    metrics = {"train": pair.train_model(
        model, data, args, args.minutes, args.lr, args.seed + 31, "mla-moe",
        after_step=lambda: balance_biases(args.bias_rate, counts))}
    metrics["expert_bias"] = {name: c["tensor"].tolist() for name, c in counts.items()}
    model = model.to(torch.bfloat16)

    draft = LlamaForCausalLM.from_pretrained(os.path.join(out, "models", "tiny-draft")).to(dev)
    metrics["eval"] = pair.evaluate(model, draft.to(torch.bfloat16), held, args)
    pair.log("HELD-OUT: " + json.dumps(metrics["eval"]))

    os.makedirs(target_dir, exist_ok=True)
    from train.hf_compat import finalize_config_json, save_pretrained_safetensors

    m = model.cpu()
    m.generation_config.bos_token_id = 0
    m.generation_config.eos_token_id = 0
    save_pretrained_safetensors(m, target_dir)
    finalize_config_json(target_dir, m.config, dtype="bfloat16", rope_theta=10000.0,
                         rope_scaling=None)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(shipped, f)):
            shutil.copy(os.path.join(shipped, f), os.path.join(target_dir, f))
    metrics["files"] = {f: os.path.getsize(os.path.join(target_dir, f))
                        for f in sorted(os.listdir(target_dir))}
    metrics["params"] = pair.count_params(m)
    pair.log(f"saved {target_dir}: {metrics['files']}")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "mla_moe_train.json"), "w") as fh:
        json.dump(metrics, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
