#!/usr/bin/env python3
"""Reference DFlash drafter outputs for the C++ CPU drafter (common/model/dflash_model.h).

Writes a random DFlash drafter for the tiny target (tests/data/models/dflash_random: config.json
and bf16 model.safetensors in the Hugging Face layout DFlash checkpoints use) and, for
seeded random target features, the drafter's block logits (tests/data/dflash_reference.json).

The forward is the published DFlash draft step (arXiv 2602.06036), written out in PyTorch:
context features -> fc -> hidden_norm; per draft layer a Qwen3 decoder layer whose attention
queries are the block rows and whose keys and values are projected from [context ; block]
(keys q/k-normed and rotated at their own positions), with no causal mask; then the final norm
and the target's LM head on block rows 1 .. B-1. The Qwen3 pieces follow Transformers'
formulas (Qwen3RMSNorm: fp32 x * rsqrt(mean(x^2) + eps), then the weight; rotate-half RoPE
with inv_freq = theta^(-2i/d); SiLU-gated MLP; scores scaled by head_dim^-0.5), which
model_reference_test checks the C++ CPU ops against for the target. Computed in float32 on the
CPU from the bf16 weights; needs only torch (safetensors are read and written here).

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

TARGET = "models/tiny-target"
DRAFTER_DIR = "tests/data/models/dflash_random"
CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "attention_bias": False,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 256,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "vocab_size": 4096,
    "num_target_layers": 6,
    "block_size": 8,
    "dflash_config": {"target_layer_ids": [1, 4], "mask_token_id": 4095},
}
# (chunks of context rows appended before each block, the block sizes drafted after them)
CASES = [([9], [8]), ([5, 3, 1], [4, 8, 2])]
PROBE_IDS = list(range(0, 4096, 128)) + [4095]


def write_safetensors(path: str, tensors: dict) -> None:
    """bf16 tensors -> a safetensors file (header JSON, then the raw little-endian data)."""
    import torch

    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        data = t.contiguous().view(dtype=torch.int16).numpy().astype("<i2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path: str, names: list[str]) -> dict:
    """The named BF16/F32 tensors of a safetensors file, as float32 torch tensors."""
    import numpy as np
    import torch

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name in names:
            if name not in header:
                continue
            info = header[name]
            f.seek(base + info["data_offsets"][0])
            raw = f.read(info["data_offsets"][1] - info["data_offsets"][0])
            if info["dtype"] == "BF16":
                bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
                values = bits.view(np.float32)
            elif info["dtype"] == "F32":
                values = np.frombuffer(raw, dtype="<f4")
            else:
                raise SystemExit(f"{path}: {name} is {info['dtype']}; expected BF16 or F32")
            out[name] = torch.from_numpy(values.copy()).reshape(info["shape"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/data/dflash_reference.json")
    args = parser.parse_args()

    import torch

    torch.manual_seed(20261206)
    hidden, hd = CONFIG["hidden_size"], CONFIG["head_dim"]
    nq, nkv = CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
    inter, eps = CONFIG["intermediate_size"], CONFIG["rms_norm_eps"]
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

    w = {k: v.float() for k, v in tensors.items()}
    target = read_safetensors(f"{TARGET}/model.safetensors",
                              ["model.embed_tokens.weight", "lm_head.weight"])
    embed = target["model.embed_tokens.weight"]
    head = target.get("lm_head.weight", embed)

    def rms_norm(x, weight):  # Qwen3RMSNorm
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))

    inv_freq = 1.0 / (CONFIG["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))

    def rope(x, positions):  # x [n, heads, hd]; rotate-half, as Transformers' Qwen3
        freqs = torch.tensor(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        half = hd // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def mlp(x, p):
        gate = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T

    def draft(ctx_rows, bonus, block):
        """Block logits after `bonus` at position len(ctx_rows), ctx_rows [n, K*H] fp32."""
        n = ctx_rows.shape[0]
        c = rms_norm(ctx_rows @ w["fc.weight"].T, w["hidden_norm.weight"])
        tokens = [bonus] + [CONFIG["dflash_config"]["mask_token_id"]] * (block - 1)
        h = embed[tokens]
        ctx_pos, blk_pos = list(range(n)), list(range(n, n + block))
        for i in range(CONFIG["num_hidden_layers"]):
            p = f"layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"])
            q = (x @ w[p + "self_attn.q_proj.weight"].T).view(block, nq, hd)
            q = rope(rms_norm(q, w[p + "self_attn.q_norm.weight"]), blk_pos)
            kv_in = torch.cat([c, x])
            k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(n + block, nkv, hd)
            k = rope(rms_norm(k, w[p + "self_attn.k_norm.weight"]), ctx_pos + blk_pos)
            v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(n + block, nkv, hd)
            k = k.repeat_interleave(nq // nkv, dim=1).transpose(0, 1)  # [heads, keys, hd]
            v = v.repeat_interleave(nq // nkv, dim=1).transpose(0, 1)
            scores = (q.transpose(0, 1) @ k.transpose(1, 2)) * hd ** -0.5  # no causal mask
            o = (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(block, nq * hd)
            h = h + o @ w[p + "self_attn.o_proj.weight"].T
            h = h + mlp(rms_norm(h, w[p + "post_attention_layernorm.weight"]), p)
        return rms_norm(h, w["norm.weight"])[1:] @ head.T

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
                logits = draft(rows[:done].float(), bonus, block)
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
