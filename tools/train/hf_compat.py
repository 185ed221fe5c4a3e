"""Small helpers that keep the scripts working on Transformers 4.4x and 5.x.

Transformers 5 folds `rope_theta` and `rope_scaling` into one `rope_parameters` dict and writes
only that to config.json. The C++ loader (common/model/config.h) and most other readers take
the classic top-level `rope_theta` / `rope_scaling` keys, so finalize_config_json() writes both
forms; Transformers 5 reads `rope_scaling` as an alias (null keeps `rope_parameters`) and
`rope_theta` only as a default, so the meaning cannot diverge. reload checks verify it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os


def has_rope_parameters(cls) -> bool:
    try:
        if "rope_parameters" in {f.name for f in dataclasses.fields(cls)}:
            return True
    except TypeError:
        pass
    try:
        return "rope_parameters" in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False


def make_config(cls, rope_theta: float, rope_scaling: dict | None, **kw):
    """cls(**kw) with RoPE given in whichever form this Transformers takes."""
    if has_rope_parameters(cls):
        rp = {"rope_type": "default"} if rope_scaling is None else dict(rope_scaling)
        rp["rope_theta"] = float(rope_theta)
        return cls(rope_parameters=rp, **kw)
    return cls(rope_theta=float(rope_theta), rope_scaling=rope_scaling, **kw)


def rope_of(config) -> tuple[float, dict | None]:
    """(theta, scaling dict without theta or None) from a loaded config, either layout."""
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict) and rp:
        theta = float(rp.get("rope_theta"))
        rest = {k: v for k, v in rp.items() if k != "rope_theta"}
        if rest.get("rope_type", rest.get("type", "default")) == "default":
            extra = set(rest) - {"rope_type", "type"}
            return theta, ({k: rest[k] for k in extra} or None)
        return theta, rest
    return float(getattr(config, "rope_theta")), getattr(config, "rope_scaling", None)


def save_pretrained_safetensors(model, out_dir: str, **kw) -> None:
    params = inspect.signature(model.save_pretrained).parameters
    if "safe_serialization" in params:
        kw["safe_serialization"] = True
    model.save_pretrained(out_dir, **kw)


# Keys a reader should never have to guess a default for; filled from the config object when
# save_pretrained left them out (it drops some values that equal a default).
EXPLICIT_KEYS = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                 "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id",
                 "sliding_window", "use_sliding_window")


def finalize_config_json(model_dir: str, config, dtype: str, rope_theta: float,
                         rope_scaling: dict | None) -> dict:
    """Writes the classic rope keys, both dtype spellings and EXPLICIT_KEYS into config.json;
    returns it."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as fh:
        cfg = json.load(fh)
    for k in EXPLICIT_KEYS:
        if k not in cfg and hasattr(config, k):
            cfg[k] = getattr(config, k)
    cfg["rope_theta"] = float(rope_theta)
    cfg["rope_scaling"] = None if rope_scaling is None else dict(rope_scaling)
    cfg["torch_dtype"] = dtype
    cfg["dtype"] = dtype
    with open(path, "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
        fh.write("\n")
    # Same meaning after a reload?
    from transformers import AutoConfig

    loaded = AutoConfig.from_pretrained(model_dir)
    theta, scaling = rope_of(loaded)
    want_scaling = None if rope_scaling is None else dict(rope_scaling)
    if want_scaling is not None:
        want_scaling.setdefault("rope_type", want_scaling.get("type"))
    if abs(theta - rope_theta) > 1e-6 * rope_theta or (scaling or None) != want_scaling:
        raise RuntimeError(f"{path}: reloaded rope ({theta}, {scaling}) != written "
                           f"({rope_theta}, {want_scaling})")
    return cfg
