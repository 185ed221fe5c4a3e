#!/usr/bin/env python3
"""Hugging Face Transformers baseline for the e2e benchmark (bench/e2e.sh).

Runs the same prompts as the services through Transformers on the GPU, greedy, a fixed number
of new tokens (EOS ignored, as the services are asked to): plain generation at batch 1 and at
batch B (left-padded), and assisted generation (`assistant_model=`, batch 1 only in
Transformers) with the draft model. Prints and writes tokens/s for each.

  python3 bench/hf_baseline.py --prompts tests/data/heldout_prompts.jsonl --limit 12 \
      --max_new_tokens 128 --batch 16 --json_out hf.json
"""
import argparse
import json
import time

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def load(path, device):
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    except TypeError:  # Transformers before `dtype=`
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
    model = model.to(device)
    model.eval()
    return model


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", default="models/tiny-target")
    p.add_argument("--draft", default="models/tiny-draft")
    p.add_argument("--prompts", default="tests/data/heldout_prompts.jsonl")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--json_out", default="")
    a = p.parse_args()

    tok = Tokenizer.from_file(f"{a.target}/tokenizer.json")
    texts = [json.loads(line)["text"] for line in open(a.prompts)][: a.limit]
    prompts = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    target, draft = load(a.target, a.device), load(a.draft, a.device)
    n = a.max_new_tokens
    common = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

    def one(ids, **kw):
        x = torch.tensor([ids], device=a.device)
        return target.generate(x, attention_mask=torch.ones_like(x), **common, **kw)[0, len(ids):]

    one(prompts[0])  # warm-up: kernels, caches
    one(prompts[0], assistant_model=draft)
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(a.device)}
    import transformers
    results["transformers"] = transformers.__version__

    outs, wall = timed(lambda: [one(ids) for ids in prompts])
    results["plain_batch1_tokens_per_s"] = n * len(prompts) / wall
    results["plain_batch1_token_ids"] = [o.tolist() for o in outs]
    _, wall = timed(lambda: [one(ids, assistant_model=draft) for ids in prompts])
    results["assisted_batch1_tokens_per_s"] = n * len(prompts) / wall

    # Plain at batch B, left-padded.
    def batch(group):
        width = max(len(ids) for ids in group)
        x = torch.tensor([[0] * (width - len(ids)) + ids for ids in group], device=a.device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in group],
                            device=a.device)
        return target.generate(x, attention_mask=mask, **common)

    groups = [prompts[i : i + a.batch] for i in range(0, len(prompts), a.batch)]
    batch(groups[0])
    _, wall = timed(lambda: [batch(g) for g in groups])
    results[f"plain_batch{a.batch}_tokens_per_s"] = n * len(prompts) / wall
    results["batch"] = a.batch
    results["prompts"] = len(prompts)
    results["max_new_tokens"] = n
    for k, v in results.items():
        if not k.endswith("token_ids"):
            print(f"hf {k}: {v:.1f}" if isinstance(v, float) else f"hf {k}: {v}")
    if a.json_out:
        json.dump(results, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
