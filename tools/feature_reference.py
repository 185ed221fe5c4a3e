#!/usr/bin/env python3
"""Reference target features for the C++ feature capture (CausalLm::SetFeatureLayers).

For each model below, loads the checkpoint with Transformers (eager attention, upcast to
float32, CPU, gradients off), runs one prompt and records the output of each listed decoder
layer (a forward hook on model.model.layers[l]: the residual stream after layer l, before any
final norm; for l < N-1 it equals DFlash's hidden_states[l + 1]). Writes
tests/data/feature_reference.json: per model its dir, layers, prompt ids and rows[t] = the
listed layers' outputs at token t side by side (layer-major), 6 significant digits.

Run from the repo root where torch and transformers are installed (the GPU machine):

    python3 tools/feature_reference.py --out tests/data/feature_reference.json
"""

from __future__ import annotations

import argparse
import datetime
import json

# (checkpoint dir, layers captured, prompt length: the start of model_reference.json's first
# case that long)
MODELS = [
    ("models/tiny-target", [0, 1, 3, 5], 12),
    ("tests/data/models/qwen3_qknorm", [0, 1], 9),
]


def layer_outputs(model_dir: str, layers: list[int], prompt: list[int]) -> list[list[float]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    model = model.float().eval()
    captured: dict[int, torch.Tensor] = {}

    def hook(index):
        def record(_module, _inputs, output):
            captured[index] = (output[0] if isinstance(output, tuple) else output).detach()
        return record

    handles = [model.model.layers[l].register_forward_hook(hook(l)) for l in layers]
    with torch.no_grad():
        model(input_ids=torch.tensor([prompt]), use_cache=False)
    for h in handles:
        h.remove()
    rows = torch.cat([captured[l][0] for l in layers], dim=-1)  # [tokens, layers * hidden]
    return [[float(f"{v:.6g}") for v in row.tolist()] for row in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="tests/data/feature_reference.json")
    p.add_argument("--model-reference", default="tests/data/model_reference.json")
    args = p.parse_args()
    import torch
    import transformers

    with open(args.model_reference, encoding="utf-8") as fh:
        cases = {m["dir"]: m["cases"] for m in json.load(fh)["models"]}
    out = {
        "generator": "tools/feature_reference.py",
        "method": "Transformers eager attention, float32 on the CPU; forward hooks on the "
                  "decoder layers (output before any final norm)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": datetime.date.today().isoformat(),
        "models": [],
    }
    for model_dir, layers, n in MODELS:
        prompt = next(c["prompt_ids"] for c in cases[model_dir] if len(c["prompt_ids"]) >= n)[:n]
        rows = layer_outputs(model_dir, layers, prompt)
        out["models"].append({"dir": model_dir, "layers": layers, "prompt_ids": prompt,
                              "rows": rows})
        print(f"{model_dir}: layers {layers}, {len(rows)} rows of {len(rows[0])}")
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=None, separators=(",", ":"), allow_nan=False)
        fh.write("\n")


if __name__ == "__main__":
    main()
