#!/usr/bin/env python3
"""Reference DFlash drafter outputs for the C++ CPU drafter (common/model/dflash_model.h).

Writes a random DFlash drafter for the tiny target (tests/data/models/dflash_random: config.json
and bf16 model.safetensors in the Hugging Face layout DFlash checkpoints use) and, for
seeded random target features, the drafter's block logits (tests/data/dflash_reference.json).

The forward is the published DFlash draft step (arXiv 2602.06036) written out in PyTorch
(`DflashDrafter` in tools/train/dflash_torch.py, the module tools/train_dflash.py trains):
context features -> fc -> hidden_norm; per draft layer a Qwen3 decoder layer whose attention
queries are the block rows and whose keys and values are projected from [context ; block]
(keys q/k-normed and rotated at their own positions), with no causal mask; then the final norm
and the target's LM head on block rows 1 .. B-1. The Qwen3 pieces follow Transformers'
formulas (Qwen3RMSNorm: fp32 x * rsqrt(mean(x^2) + eps), then the weight; rotate-half RoPE
with inv_freq = theta^(-2i/d); SiLU-gated MLP; scores scaled by head_dim^-0.5), which
model_reference_test checks the C++ CPU ops against for the target. Computed in float32 on the
CPU from the bf16 weights; needs only torch and numpy.

Each case appends context rows in chunks (as a session does, commit by commit) and drafts a
block after each; the case records the logits at a fixed set of token ids and each row's top 8.

Run from the repo root (any machine with torch, e.g. Debian's python3-torch):

    python3 tools/dflash_reference.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train.dflash_torch import (DflashDrafter, dflash_config, read_safetensors,  # noqa: E402
                                write_safetensors)

TARGET = "models/tiny-target"
DRAFTER_DIR = "tests/data/models/dflash_random"
CONFIG = dflash_config(hidden=256, vocab=4096, target_layers=[1, 4], n_target_layers=6,
                       draft_layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=128,
                       block_size=8, mask_token_id=4095, rope_theta=10000.0)
# (chunks of context rows appended before each block, the block sizes drafted after them)
CASES = [([9], [8]), ([5, 3, 1], [4, 8, 2])]
PROBE_IDS = list(range(0, 4096, 128)) + [4095]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/data/dflash_reference.json")
    args = parser.parse_args()

    import torch

    torch.manual_seed(20261206)
    hidden, hd = CONFIG["hidden_size"], CONFIG["head_dim"]
    nq, nkv = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
    inter = CONFIG["intermediate_size"]
    layers_k = len(CONFIG["dflash_config"]["target_layer_ids"])

    def rand(*shape, std=0.05):
        return (torch.randn(*shape) * std).to(torch.bfloat16)

    def norm_w(n):
        return (1.0 + torch.randn(n) * 0.1).to(torch.bfloat16)

    tensors = {}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"layers.{i}."
        tensors[p + "input_layernorm.weight"] = norm_w(hidden)
        tensors[p + "post_attention_layernorm.weight"] = norm_w(hidden)
        tensors[p + "self_attn.q_proj.weight"] = rand(nq * hd, hidden)
        tensors[p + "self_attn.k_proj.weight"] = rand(nkv * hd, hidden)
        tensors[p + "self_attn.v_proj.weight"] = rand(nkv * hd, hidden)
        tensors[p + "self_attn.o_proj.weight"] = rand(hidden, nq * hd)
        tensors[p + "self_attn.q_norm.weight"] = norm_w(hd)
        tensors[p + "self_attn.k_norm.weight"] = norm_w(hd)
        tensors[p + "mlp.gate_proj.weight"] = rand(inter, hidden)
        tensors[p + "mlp.up_proj.weight"] = rand(inter, hidden)
        tensors[p + "mlp.down_proj.weight"] = rand(hidden, inter)
    tensors["norm.weight"] = norm_w(hidden)
    tensors["fc.weight"] = rand(hidden, layers_k * hidden)
    tensors["hidden_norm.weight"] = norm_w(hidden)
    os.makedirs(DRAFTER_DIR, exist_ok=True)
    write_safetensors(f"{DRAFTER_DIR}/model.safetensors", tensors)
    with open(f"{DRAFTER_DIR}/config.json", "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")

    target = read_safetensors(f"{TARGET}/model.safetensors",
                              ["model.embed_tokens.weight", "lm_head.weight"])
    embed = target["model.embed_tokens.weight"]
    drafter = DflashDrafter(CONFIG, embed, target.get("lm_head.weight", embed))
    drafter.load({k: v.float() for k, v in tensors.items()})

    gen = torch.Generator().manual_seed(7)
    cases = []
    with torch.no_grad():
        for chunks, blocks in CASES:
            rows = torch.randn(sum(chunks), layers_k * hidden, generator=gen) * 2.0
            rows = rows.to(torch.bfloat16)
            bits = rows.view(torch.int16).to(torch.int32) & 0xFFFF
            case = {"chunks": [], "blocks": []}
            done = 0
            for chunk, block in zip(chunks, blocks):
                case["chunks"].append(bits[done:done + chunk].tolist())
                done += chunk
                bonus = int(torch.randint(0, 4095, (1,), generator=gen))
                logits = drafter.draft_block(rows[:done].float(), bonus, block)
                top = torch.topk(logits, 8, dim=-1)
                case["blocks"].append({
                    "bonus": bonus, "block": block,
                    "probe_logits": [[round(float(v), 6) for v in r] for r in logits[:, PROBE_IDS]],
                    "top_ids": top.indices.tolist(),
                    "top_logits": [[round(float(v), 6) for v in r] for r in top.values],
                })
            cases.append(case)

    out = {
        "generator": "tools/dflash_reference.py",
        "made": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "drafter": DRAFTER_DIR,
        "target": TARGET,
        "probe_ids": PROBE_IDS,
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {args.out} and {DRAFTER_DIR}")


if __name__ == "__main__":
    main()
