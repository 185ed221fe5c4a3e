#!/usr/bin/env python3
"""Transformers fp32 references for DeepSeek-V3-family (MLA + MoE) checkpoints.

Run where torch and Transformers are (the GPU machine; it computes on the CPU in float32):

    python3 tools/mla_moe_reference.py --out .        # writes under ./tests/data/

Writes:
  tests/data/models/deepseek_<case>/   small random-weight DeepseekV3ForCausalLM checkpoints,
                                       saved by Transformers' save_pretrained (bf16)
  tests/data/mla_moe_reference.json    per case and prompt: the greedy continuation, the top-2
                                       logit margin at every step, the first step's logits

The cases cover what issue 35 asks the CPU oracle to match: q LoRA on and off, one and several
expert groups, norm_topk_prob on and off, 0 / 1 / 2 shared experts, dense first layers, YaRN
with mscale and mscale_all_dim (equal, as DeepSeek-V3 ships them, and different), head widths
that are not powers of two, rope_interleave on and off.

Weights: projections N(0, 1/in_features), embeddings N(0, 1), the LM head N(0, 3/sqrt(hidden)),
norms 1 + U(-0.2, 0.2), the router N(0, 1/hidden) and its score bias U(0, 0.1). The bias is
non-negative so every biased score is positive: experts outside the kept groups (scored 0.0)
never win a slot, and no ranking depends on how torch.topk breaks ties (the C++ router ranks
equal scores by lower index; moe_router_test covers that case on its own).

Greedy: an argmax loop with full recompute (no KV cache), eos ignored; `margins[i]` is the gap
between the best and second-best logit at step i, so a comparison can stop where the reference
itself is within fp32 noise of a tie.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train.hf_compat import finalize_config_json, make_config, save_pretrained_safetensors  # noqa: E402

VOCAB = 512

COMMON = dict(vocab_size=VOCAB, hidden_size=96, intermediate_size=192, num_hidden_layers=3,
              num_attention_heads=8, num_key_value_heads=8, hidden_act="silu",
              max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
              pad_token_id=None, tie_word_embeddings=False, attention_bias=False,
              kv_lora_rank=40, qk_nope_head_dim=24, qk_rope_head_dim=12, v_head_dim=20,
              n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=64,
              routed_scaling_factor=2.5, initializer_range=0.02)

YARN_DEEPSEEK = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
YARN_UNEQUAL = dict(YARN_DEEPSEEK, mscale=1.0, mscale_all_dim=0.5)

# name, rope_theta, rope scaling, config overrides, prompt lengths
CASES = [
    ("deepseek_qlora_groups", 10000.0, YARN_UNEQUAL,
     dict(q_lora_rank=48, n_group=4, topk_group=2, norm_topk_prob=True, n_shared_experts=1,
          first_k_dense_replace=1, rope_interleave=True), [1, 9, 40]),
    ("deepseek_direct_q", 10000.0, None,
     dict(q_lora_rank=None, n_group=1, topk_group=1, norm_topk_prob=False, n_shared_experts=0,
          first_k_dense_replace=0, rope_interleave=False), [1, 7, 33]),
    ("deepseek_two_shared", 50000.0, YARN_DEEPSEEK,
     dict(q_lora_rank=48, n_group=2, topk_group=1, norm_topk_prob=True, n_shared_experts=2,
          first_k_dense_replace=2, rope_interleave=True), [1, 12, 60]),
]


def fill_weights(model, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * torch.rand(p.shape, generator=gen))
            elif name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.4 * (torch.rand(p.shape, generator=gen) - 0.5))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("lm_head.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 3 / math.sqrt(hidden))
            elif p.dim() >= 2 and p.shape[-1] > 0:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.rand(b.shape, generator=gen))


def greedy(model, prompt: list[int], n: int):
    import torch

    ids, margins, first = list(prompt), [], None
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        if first is None:
            first = logits.clone()
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], margins, first


def references(name: str, rel: str, d: str, lengths: list[int], seed: int, args) -> dict:
    """Greedy continuations of random prompts on the checkpoint in `d`, as stored and reloaded
    (what the C++ loader reads too)."""
    import safetensors
    import torch
    from transformers import AutoModelForCausalLM

    names = set()
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safetensors.safe_open(os.path.join(d, f), "pt") as fh:
                names.update(fh.keys())
    fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    stored = cfg.get("dtype") or cfg.get("torch_dtype")
    ref = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").float().eval()
    vocab = ref.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for n in lengths:
        prompt = torch.randint(3, vocab, (n,), generator=gen).tolist()
        ids, margins, first = greedy(ref, prompt, args.new_tokens)
        cases.append({"prompt_ids": prompt, "greedy_ids": ids,
                      "margins": [float(f"{m:.6g}") for m in margins],
                      "first_logits": [float(f"{v:.6g}") for v in first.tolist()]})
    print(f"{name}: {len(names)} tensors ({'fused' if fused else 'per-expert'} experts), "
          f"min margin {min(min(c['margins']) for c in cases):.3g}")
    return {"name": name, "dir": rel, "fused_experts": fused, "architecture": type(ref).__name__,
            "stored_dtype": stored, "vocab_size": vocab,
            "cases": cases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="repository root to write tests/data under")
    ap.add_argument("--new_tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--existing", action="append", default=[],
                    help="a checkpoint already under --out (e.g. models/tiny-mla-moe) to write "
                         "references for too, as stored; repeatable")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    torch.set_grad_enabled(False)
    data = os.path.join(args.out, "tests", "data")
    models = []
    for i, (name, theta, scaling, overrides, lengths) in enumerate(CASES):
        cfg = make_config(DeepseekV3Config, rope_theta=theta, rope_scaling=scaling,
                          **{**COMMON, **overrides})
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
        fill_weights(model, args.seed + i)
        model = model.to(torch.bfloat16)
        d = os.path.join(data, "models", name)
        os.makedirs(d, exist_ok=True)
        save_pretrained_safetensors(model, d)
        finalize_config_json(d, model.config, dtype="bfloat16", rope_theta=theta,
                             rope_scaling=scaling)
        models.append(references(name, f"models/{name}", d, lengths, 1000 + i, args))
    for rel in args.existing:
        models.append(references(os.path.basename(rel.rstrip("/")), rel,
                                 os.path.join(args.out, rel), [1, 16, 64], 2000, args))

    out = {
        "generator": {"transformers": transformers.__version__, "torch": torch.__version__,
                      "date": datetime.date.today().isoformat(),
                      "script": "tools/mla_moe_reference.py"},
        "method": ("AutoModelForCausalLM.from_pretrained(dir, attn_implementation='eager')"
                   ".float() on the CPU, no grad; greedy argmax loop with full recompute, eos "
                   "ignored; margins = top-1 minus top-2 logit per step; 6 significant digits"),
        "models": models,
    }
    with open(os.path.join(data, "mla_moe_reference.json"), "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
