"""PyTorch pieces shared by the DFlash tools: safetensors I/O, the tiny Llama target (features and
greedy continuations) and the DFlash drafter (arXiv 2602.06036) as a trainable module.

Needs only torch and numpy (no Transformers), so it runs on Debian's python3-torch (1.13, no
scaled_dot_product_attention: attention falls back to plain matmuls) as well as on the GPU
machine. The formulas are Transformers' Llama and Qwen3 ones: RMSNorm in fp32
(x * rsqrt(mean(x^2) + eps), cast back, then the weight), rotate-half RoPE with
inv_freq = theta^(-2i/d), SiLU-gated MLP, scores scaled by head_dim^-0.5.
`LlamaModel` is checked against Transformers' logits (tests/data/model_reference.json) by
`tools/train_dflash.py --check`.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# safetensors


def write_safetensors(path: str, tensors: dict) -> None:
    """bf16 tensors -> a safetensors file (header JSON, then the raw little-endian data)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().to(torch.bfloat16)
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


def read_safetensors(path: str, names: list[str] | None = None) -> dict:
    """The named (default: all) BF16/F32 tensors of a safetensors file, as float32 tensors."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name in names if names is not None else header:
            if name not in header or name == "__metadata__":
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


# ---------------------------------------------------------------------------------------------
# Shared layers


def rms_norm(x, weight, eps):
    """Transformers' LlamaRMSNorm / Qwen3RMSNorm: fp32 statistics, cast back, then the weight."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_tables(positions, head_dim: int, theta: float):
    """cos, sin [..., head_dim] (fp32) for integer positions of any shape."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x [S, T, heads, hd]; cos/sin [S, T, hd] (rotate-half, as Transformers)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    c, s = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    return x * c + rotated * s


def attend(q, k, v, mask=None, causal=False):
    """q [S, T, hq, hd], k/v [S, N, hkv, hd]; mask [S, T, N] bool (True = attend) or causal
    (query t sees keys up to N - T + t). Returns [S, T, hq * hd]."""
    S, T, hq, hd = q.shape
    group = hq // k.shape[2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    N = k.shape[2]
    if causal:
        mask = (torch.arange(N, device=q.device)[None, :]
                <= torch.arange(T, device=q.device)[:, None] + (N - T))[None]
    m = None if mask is None else mask[:, None]
    if hasattr(F, "scaled_dot_product_attention"):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    else:
        scores = (q @ k.transpose(-1, -2)) * hd ** -0.5
        if m is not None:
            scores = scores.masked_fill(~m, float("-inf"))
        o = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
    return o.transpose(1, 2).reshape(S, T, hq * hd)


def swiglu(x, gate, up, down):
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


# ---------------------------------------------------------------------------------------------
# The target: a Llama checkpoint (the tiny target), read-only


class LlamaModel:
    """A Llama / Qwen2-style decoder read from a Hugging Face directory (no biases, no q/k norm,
    default RoPE: what the tiny pair is). `forward` returns logits and the hidden states after
    the listed layers (Transformers' hidden_states[l + 1]); `greedy` continues prompts with a
    KV cache."""

    def __init__(self, model_dir: str, device="cpu", dtype=torch.float32):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.cfg = cfg
        self.hidden = cfg["hidden_size"]
        self.n_layers = cfg["num_hidden_layers"]
        self.nq = cfg["num_attention_heads"]
        self.nkv = cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or self.hidden // self.nq
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
        if cfg.get("rope_scaling"):
            raise SystemExit(f"{model_dir}: rope_scaling is not supported here")
        w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
        if "lm_head.weight" not in w:
            w["lm_head.weight"] = w["model.embed_tokens.weight"]
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in w.items()}
        self.device, self.dtype = device, dtype

    def _layer(self, i, h, positions, cache, pos0):
        p = f"model.layers.{i}."
        w = self.w
        S, T, _ = h.shape
        x = rms_norm(h, w[p + "input_layernorm.weight"], self.eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(S, T, self.nq, self.hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(S, T, self.nkv, self.hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(S, T, self.nkv, self.hd)
        cos, sin = rope_tables(positions, self.hd, self.theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            cache[i][0][:, pos0:pos0 + T] = k
            cache[i][1][:, pos0:pos0 + T] = v
            k, v = cache[i][0][:, :pos0 + T], cache[i][1][:, :pos0 + T]
        o = attend(q, k, v, causal=True)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps)
        return h + swiglu(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                          w[p + "mlp.down_proj.weight"])

    @torch.no_grad()
    def forward(self, ids, feature_layers=(), cache=None, pos0=0, logits=True):
        """ids [S, T] -> (logits [S, T, V] or None, features [S, T, len(layers) * H])."""
        S, T = ids.shape
        positions = (torch.arange(T, device=ids.device) + pos0)[None].expand(S, T)
        h = self.w["model.embed_tokens.weight"][ids]
        feats = []
        for i in range(self.n_layers):
            h = self._layer(i, h, positions, cache, pos0)
            if i in feature_layers:
                feats.append(h)
        out = None
        if logits:
            out = rms_norm(h, self.w["model.norm.weight"], self.eps) @ self.w["lm_head.weight"].T
        return out, (torch.cat(feats, dim=-1) if feats else None)

    @torch.no_grad()
    def greedy(self, prompt, n: int):
        """prompt [S, P] -> [S, P + n]: the greedy continuation (argmax, first index on ties)."""
        S, P = prompt.shape
        shape = (S, P + n, self.nkv, self.hd)
        cache = [(torch.empty(shape, device=prompt.device, dtype=self.dtype),
                  torch.empty(shape, device=prompt.device, dtype=self.dtype))
                 for _ in range(self.n_layers)]
        out = torch.empty(S, P + n, dtype=prompt.dtype, device=prompt.device)
        out[:, :P] = prompt
        logits, _ = self.forward(prompt, cache=cache)
        nxt = logits[:, -1].float().argmax(-1)
        for t in range(n):
            out[:, P + t] = nxt
            if t + 1 == n:
                break
            logits, _ = self.forward(nxt[:, None], cache=cache, pos0=P + t)
            nxt = logits[:, -1].float().argmax(-1)
        return out


# ---------------------------------------------------------------------------------------------
# The DFlash drafter


def dflash_config(hidden, vocab, target_layers, n_target_layers, draft_layers, heads, kv_heads,
                  head_dim, intermediate, block_size, mask_token_id, rope_theta,
                  max_positions=2048, eps=1e-6) -> dict:
    """config.json of a Hugging Face DFlashDraftModel (its draft layers are a Qwen3 decoder)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_positions,
        "num_attention_heads": heads,
        "num_hidden_layers": draft_layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": eps,
        "rope_theta": rope_theta,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "num_target_layers": n_target_layers,
        "block_size": block_size,
        "dflash_config": {"target_layer_ids": list(target_layers),
                          "mask_token_id": mask_token_id},
    }


class DflashDrafter(torch.nn.Module):
    """The published draft step: context feature rows -> fc -> hidden_norm = c; per draft layer
    a Qwen3 decoder layer whose queries are the block rows and whose keys and values are
    projected from [c ; block] (keys q/k-normed and rotated at their own positions), masked by
    the caller (no causal mask inside a block); then the final norm. The target's embedding and
    LM head are frozen buffers, not parameters: they are not saved with the drafter."""

    def __init__(self, cfg: dict, embed, head):
        super().__init__()
        self.cfg = cfg
        H, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nq, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.eps, self.theta = cfg["rms_norm_eps"], cfg["rope_theta"]
        K = len(cfg["dflash_config"]["target_layer_ids"])
        inter = cfg["intermediate_size"]
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("head", head, persistent=False)
        shapes = {"norm.weight": (H,), "fc.weight": (H, K * H), "hidden_norm.weight": (H,)}
        for i in range(cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (H,),
                p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (self.nq * hd, H),
                p + "self_attn.k_proj.weight": (self.nkv * hd, H),
                p + "self_attn.v_proj.weight": (self.nkv * hd, H),
                p + "self_attn.o_proj.weight": (H, self.nq * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (inter, H),
                p + "mlp.up_proj.weight": (inter, H),
                p + "mlp.down_proj.weight": (H, inter),
            })
        self.names = sorted(shapes)
        self.params = torch.nn.ParameterDict({
            n.replace(".", "__"): torch.nn.Parameter(
                torch.ones(s) if len(s) == 1 else torch.randn(s) * 0.02)
            for n, s in shapes.items()})

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def tensors(self) -> dict:
        """The drafter's own tensors under their checkpoint names."""
        return {n: self.p(n).detach() for n in self.names}

    def load(self, tensors: dict) -> None:
        with torch.no_grad():
            for n in self.names:
                self.p(n).copy_(tensors[n])

    def forward(self, ctx_rows, ctx_pos, block_tokens, block_pos, mask):
        """ctx_rows [S, L, K*H], ctx_pos [S, L], block_tokens / block_pos [S, NB],
        mask [S, NB, L + NB] (True = attend) -> normed block hidden states [S, NB, H]."""
        S, NB = block_tokens.shape
        L = ctx_rows.shape[1]
        c = rms_norm(ctx_rows @ self.p("fc.weight").T, self.p("hidden_norm.weight"), self.eps)
        h = self.embed[block_tokens].to(c.dtype)
        cos_c, sin_c = rope_tables(ctx_pos, self.hd, self.theta)
        cos_b, sin_b = rope_tables(block_pos, self.hd, self.theta)
        cos, sin = torch.cat([cos_c, cos_b], dim=1), torch.cat([sin_c, sin_b], dim=1)
        for i in range(self.cfg["num_hidden_layers"]):
            pre = f"layers.{i}."
            a = pre + "self_attn."
            x = rms_norm(h, self.p(pre + "input_layernorm.weight"), self.eps)
            q = (x @ self.p(a + "q_proj.weight").T).view(S, NB, self.nq, self.hd)
            q = apply_rope(rms_norm(q, self.p(a + "q_norm.weight"), self.eps), cos_b, sin_b)
            kv_in = torch.cat([c, x], dim=1)
            k = (kv_in @ self.p(a + "k_proj.weight").T).view(S, L + NB, self.nkv, self.hd)
            k = apply_rope(rms_norm(k, self.p(a + "k_norm.weight"), self.eps), cos, sin)
            v = (kv_in @ self.p(a + "v_proj.weight").T).view(S, L + NB, self.nkv, self.hd)
            h = h + attend(q, k, v, mask=mask) @ self.p(a + "o_proj.weight").T
            x = rms_norm(h, self.p(pre + "post_attention_layernorm.weight"), self.eps)
            h = h + swiglu(x, self.p(pre + "mlp.gate_proj.weight"),
                           self.p(pre + "mlp.up_proj.weight"), self.p(pre + "mlp.down_proj.weight"))
        return rms_norm(h, self.p("norm.weight"), self.eps)

    def logits(self, hidden):
        return hidden @ self.head.T.to(hidden.dtype)

    def draft_block(self, ctx_rows, bonus: int, block: int):
        """One session's step: block logits [block - 1, V] after `bonus` at position n, the
        context rows [n, K*H] being the features of the n tokens before it."""
        n = ctx_rows.shape[0]
        dev = ctx_rows.device
        mask_id = self.cfg["dflash_config"]["mask_token_id"]
        tokens = torch.tensor([[bonus] + [mask_id] * (block - 1)], device=dev)
        mask = torch.ones(1, block, n + block, dtype=torch.bool, device=dev)
        h = self.forward(ctx_rows[None], torch.arange(n, device=dev)[None], tokens,
                         torch.arange(n, n + block, device=dev)[None], mask)
        return self.logits(h[0, 1:])
