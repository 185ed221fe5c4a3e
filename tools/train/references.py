"""Reference vectors for the C++ tokenizer and model loader, computed with Hugging Face
`tokenizers` / Transformers on the CPU in float32.

Writes under <out>/tests/data/:
  tokenizer_reference.json                 cases for models/tiny-target/tokenizer.json
  tokenizers/llama3_style/tokenizer.json   a small Llama-3-style BPE (Split regex + ByteLevel)
  tokenizer_reference_llama3_style.json    cases for it
  models/<name>/                           small random-weight HF checkpoints
  model_reference.json                     prompt -> greedy ids and first-step logits per model
  heldout_prompts.jsonl                    beginnings of held-out standard-library code

Model references: each checkpoint is loaded from disk with AutoModelForCausalLM (eager
attention), upcast to float32 with model.float(), and run on the CPU with gradients off.
`greedy_ids` come from an argmax loop with full recompute (no KV cache; eos does not stop it;
torch.argmax, first index on ties); `first_logits` are the logits of the last prompt position
rounded to 6 significant digits. HF generate() is run too as a cross-check.
"""

from __future__ import annotations

import datetime
import json
import os

from train import corpus as corpus_mod
from train.hf_compat import finalize_config_json, make_config, save_pretrained_safetensors

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Strings that exercise pre-tokenization, byte-level mapping, added tokens and decoding.
TOKENIZER_CASES = [
    "",
    "Hello, world!",
    "def foo(x):\n    return x + 1\n",
    "\tindented\twith\ttabs\n\t\tdouble\ttab",
    "multiple    spaces   between  words",
    "trailing spaces   ",
    " leading space",
    "   ",
    "line one\r\nline two\r\n",
    "\n\n\nthree newlines then text\n",
    "mixed \t \n \r\n  whitespace\t\n\t \n",
    "日本語のテキスト、中文字符。",
    "한국어 텍스트입니다",
    "I love 🍕 and 🎉!",
    "👨‍👩‍👧‍👦 family and 👩🏽‍💻 coder",
    "👍🏽 👋🏿 🤝🏻",
    "flags 🇺🇸🇯🇵🇩🇪",
    "e\u0301 cafe\u0301 Z\u0351\u0352\u0353a\u0300lgo",
    "café naïve résumé Ünïcödé ß ẞ ﬁ",
    "مرحبا بالعالم",
    "שלום עולם",
    "العدد 123 هو rtl‏mixed",
    "1234567890 3.14159 -42 1e-10 0x1F 0b1010",
    "1,000,000 and 12345678901234567890",
    "I'm sure it's John's; they're here, we've done, you'll see, he'd go",
    "I'M SURE IT'S JOHN'S; THEY'RE HERE, WE'VE, YOU'LL, HE'D, DON'T",
    "don't won't can't shouldn't 'quoted' ''",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "a <|endoftext|> b<|endoftext|><|endoftext|>c",
    "<|endoftext <|endoftext|",
    'if __name__ == "__main__":\n    main()\n',
    'class Foo(Bar):\n    """Docstring."""\n\n    def __init__(self, *args, **kwargs) -> None:\n'
    '        super().__init__(*args, **kwargs)\n        self._x: dict[str, int] = {}\n',
    "int main() { std::vector<int> v{1, 2, 3}; return v[0] >> 1; }",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b\\n"}}',
    "!!!???...---***/// ==> <= >= != :: ->",
    "x=1;y=2;z=x**y//3%4&5|6^~7",
    "https://example.com/path?q=1&r=2#frag",
    "Hello世界🌍Мир Привет, мир! Γειά σου Κόσμε",
    "∀x∈ℝ: x² ≥ 0 → √x ∈ ℝ⁺",
    "สวัสดีชาวโลก नमस्ते दुनिया",
    "❤️ ☺︎ ✔️",
    "nul\x00and\x01control\x7fchars\x07",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "    # comment with trailing spaces    \n    pass\n",
]

LLAMA3_EXTRA_CASES = [
    "<|begin_of_text|>Hello<|end_of_text|>",
    "call <tool> now<tool><tool>",
    "<to ol> <tool <tool>> tool",
    "<|begin_of_text|><tool>x<|end_of_text|>",
    "12345678 1234 12 1",
    "   leading\n\n  trailing  \n",
    "HELLO'S world'S 'LL",
]


def _tok_cases(tok, texts):
    cases, mismatches = [], 0
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != text:
            mismatches += 1
        cases.append({"text": text, "ids": ids, "decoded": decoded})
    return cases, mismatches


def _write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=1, allow_nan=False)
        fh.write("\n")


def train_llama3_style_tokenizer(texts: list[str], vocab_size: int = 1000):
    """Llama-3-style byte-level BPE: Split(regex, isolated) then ByteLevel(use_regex=False),
    BPE with ignore_merges, two special tokens and one non-special added token."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers,
                            processors, trainers)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(iter(texts), trainer=trainer)
    # Llama 3's tokenizer.json has "ignore_merges": true; set it the same way here.
    d = json.loads(tok.to_str())
    d["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(d))
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", 0)])
    return tok


# ---------------------------------------------------------------------------------------------
# Models


def _rounded(values) -> list[float]:
    return [float(f"{v:.6g}") for v in values]


def _load_cpu_f32(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    stored = next(m.parameters()).dtype
    m = m.float().eval()
    return m, str(stored).replace("torch.", "")


def _greedy(model, prompt: list[int], n: int):
    import torch

    ids = list(prompt)
    first = None
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        if first is None:
            first = logits.clone()
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], first


def _hf_generate(model, prompt: list[int], n: int):
    import torch

    model.generation_config.eos_token_id = None
    out = model.generate(input_ids=torch.tensor([prompt]),
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def model_cases(model_dir: str, prompts: list[list[int]], n_new: int, log) -> dict:
    import torch

    model, stored = _load_cpu_f32(model_dir)
    cases, gen_agree, gen_err = [], 0, None
    with torch.no_grad():
        for p in prompts:
            greedy, first = _greedy(model, p, n_new)
            try:
                hf = _hf_generate(model, p, n_new)
                if hf == greedy:
                    gen_agree += 1
                else:
                    k = next((i for i, (a, b) in enumerate(zip(hf, greedy)) if a != b),
                             min(len(hf), len(greedy)))
                    top2 = torch.topk(first, 2).values.tolist()
                    log(f"  generate differs at new token {k} (prompt len {len(p)}): "
                        f"generate {hf[max(0, k - 2):k + 3]} vs loop {greedy[max(0, k - 2):k + 3]};"
                        f" first-step top-2 logits {top2}")
            except Exception as e:  # noqa: BLE001 - cross-check only
                gen_err = repr(e)
            cases.append({"prompt_ids": list(p), "greedy_ids": greedy,
                          "first_logits": _rounded(first.tolist())})
    cfg = model.config
    log(f"references {model_dir}: {type(model).__name__} stored {stored}, {len(prompts)} "
        f"prompts; HF generate agrees on {gen_agree}/{len(prompts)}"
        + (f" (error {gen_err})" if gen_err else ""))
    return {"architecture": type(model).__name__, "stored_dtype": stored,
            "vocab_size": cfg.vocab_size, "hf_generate_agrees": gen_agree,
            "cases": cases}


RANDOM_VOCAB = 512


def _random_model_specs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=RANDOM_VOCAB, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                  max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1,
                  eos_token_id=2, pad_token_id=None, initializer_range=0.1)
    llama3_rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    specs = [
        # name, cls, rope_theta, rope_scaling, dtype, extra kwargs, prompt lengths, save kwargs
        ("llama_untied_f32", LlamaConfig, 10000.0, None, "float32",
         dict(intermediate_size=128, tie_word_embeddings=False, attention_bias=False,
              mlp_bias=False), [1, 7, 23], {}),
        ("llama3_rope_scaling_bf16", LlamaConfig, 500000.0, llama3_rope, "bfloat16",
         dict(intermediate_size=128, tie_word_embeddings=True, attention_bias=False,
              mlp_bias=False), [1, 9, 100], {}),
        ("mistral_f16", MistralConfig, 10000.0, None, "float16",
         dict(intermediate_size=160, tie_word_embeddings=False, sliding_window=None),
         [1, 8, 30], {}),
        ("qwen2_bias", Qwen2Config, 1000000.0, None, "bfloat16",
         dict(intermediate_size=128, tie_word_embeddings=True, use_sliding_window=False,
              sliding_window=None), [1, 6, 40], {}),
        ("qwen3_qknorm", Qwen3Config, 1000000.0, None, "bfloat16",
         dict(intermediate_size=160, tie_word_embeddings=True, head_dim=32,
              attention_bias=False, use_sliding_window=False, sliding_window=None),
         [1, 5, 33], {}),
        ("llama_sharded", LlamaConfig, 10000.0, None, "bfloat16",
         dict(intermediate_size=128, tie_word_embeddings=False, attention_bias=False,
              mlp_bias=False), [1, 12, 20], {"max_shard_size": "100KB"}),
    ]
    return [(n, c, th, sc, dt, {**common, **kw}, pl, sk) for n, c, th, sc, dt, kw, pl, sk in specs]


def build_random_model(name, cls, theta, scaling, dtype, kw, save_kw, out_dir, seed, log):
    import torch
    from transformers import AutoModelForCausalLM

    from train.hf_compat import rope_of

    torch.manual_seed(seed)
    cfg = make_config(cls, rope_theta=theta, rope_scaling=scaling, **kw)
    model = AutoModelForCausalLM.from_config(cfg)
    arch = type(model).__name__
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)          # not all ones: catches a skipped norm weight
            elif pname.endswith(".bias"):
                p.normal_(0.0, 0.1)           # HF starts biases at zero
            elif p.dim() >= 2:
                p.normal_(0.0, 0.1)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > 200_000 or model.config.vocab_size != RANDOM_VOCAB:
        raise RuntimeError(f"{name}: {n_params} params, vocab {model.config.vocab_size}: "
                           "not the small shape asked for")
    tdtype = getattr(torch, dtype)
    model = model.to(tdtype)
    model.config.architectures = [arch]
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    save_pretrained_safetensors(model, d, **save_kw)
    finalize_config_json(d, model.config, dtype=dtype, rope_theta=theta, rope_scaling=scaling)
    files = sorted(os.listdir(d))
    if "max_shard_size" in save_kw:
        shards = [f for f in files if f.endswith(".safetensors")]
        if len(shards) < 2 or "model.safetensors.index.json" not in files:
            raise RuntimeError(f"{d}: expected >= 2 shards and an index, got {files}")
    # Reload: same weights bit for bit, same rope.
    re_m = AutoModelForCausalLM.from_pretrained(d)
    sd0, sd1 = model.state_dict(), re_m.state_dict()
    for k, v in sd0.items():
        if k not in sd1 or not torch.equal(v, sd1[k]):
            raise RuntimeError(f"{d}: reloaded {k} differs")
    if next(re_m.parameters()).dtype != tdtype:
        raise RuntimeError(f"{d}: reloaded dtype {next(re_m.parameters()).dtype}")
    theta1, _ = rope_of(re_m.config)
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in files}
    log(f"random model {name}: {arch} {dtype}, rope theta {theta1}, files {sizes}")
    return d, sizes


# ---------------------------------------------------------------------------------------------


def write_all(out_dir: str, args, log) -> dict:
    import numpy as np
    import tokenizers
    import torch
    import transformers
    from tokenizers import Tokenizer

    torch.set_grad_enabled(False)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    data_dir = os.path.join(out_dir, "tests", "data")
    os.makedirs(data_dir, exist_ok=True)
    summary = {}
    generator = {"transformers": transformers.__version__, "torch": torch.__version__,
                 "tokenizers": tokenizers.__version__,
                 "date": datetime.date.today().isoformat(),
                 "script": "tools/train_tiny_pair.py (tools/train/references.py)"}

    # --- tokenizer references
    tiny_tok_path = os.path.join(out_dir, "models", "tiny-target", "tokenizer.json")
    tok = Tokenizer.from_file(tiny_tok_path)
    cases, mism = _tok_cases(tok, TOKENIZER_CASES)
    _write_json(os.path.join(data_dir, "tokenizer_reference.json"),
                {"generator": generator, "tokenizer_json": "models/tiny-target/tokenizer.json",
                 "cases": cases})
    log(f"tokenizer_reference.json: {len(cases)} cases, {mism} where decode(encode(t)) != t")
    summary["tokenizer_cases"] = len(cases)

    held = corpus_mod.discover_heldout_only(args.heldout_frac, args.seed)
    std_root, _ = corpus_mod.source_roots()
    # The Llama-3-style tokenizer learns from standard-library files that are not held out.
    train_texts, total = [], 0
    held_set = {f.rel for f in held}
    for rel, _ in corpus_mod._walk_py(std_root, 1_000_000):
        if rel in held_set or corpus_mod.is_test_path(rel):
            continue
        t = corpus_mod._read_text(os.path.join(std_root, rel))
        if t:
            train_texts.append(t)
            total += len(t)
        if total > 3_000_000:
            break
    train_texts += TOKENIZER_CASES  # so that a few non-ASCII merges exist
    l3 = train_llama3_style_tokenizer(train_texts, vocab_size=1000)
    l3_dir = os.path.join(data_dir, "tokenizers", "llama3_style")
    os.makedirs(l3_dir, exist_ok=True)
    l3.save(os.path.join(l3_dir, "tokenizer.json"), pretty=True)
    l3 = Tokenizer.from_file(os.path.join(l3_dir, "tokenizer.json"))
    cases, mism = _tok_cases(l3, TOKENIZER_CASES + LLAMA3_EXTRA_CASES)
    _write_json(os.path.join(data_dir, "tokenizer_reference_llama3_style.json"),
                {"generator": generator,
                 "tokenizer_json": "tests/data/tokenizers/llama3_style/tokenizer.json",
                 "cases": cases})
    log(f"llama3-style tokenizer: vocab {l3.get_vocab_size()}, {len(cases)} cases, {mism} "
        f"where decode(encode(t)) != t")
    summary["llama3_tokenizer_cases"] = len(cases)

    # --- held-out prompts
    snippets = corpus_mod.heldout_snippets(held, 24)
    with open(os.path.join(data_dir, "heldout_prompts.jsonl"), "w", encoding="utf-8") as fh:
        for s in snippets:
            fh.write(json.dumps({"text": s["text"], "source": "stdlib/" + s["file"]},
                                ensure_ascii=False) + "\n")
    log(f"heldout_prompts.jsonl: {len(snippets)} snippets from "
        f"{len({s['file'] for s in snippets})} held-out files")
    summary["heldout_prompts"] = len(snippets)

    # --- model references
    entries = []
    prompts = [[0]]
    for s, n in zip(snippets[:4], (12, 48, 120, 199)):
        ids = tok.encode(s["text"], add_special_tokens=False).ids
        prompts.append([0] + ids[:n])
    for name in ("tiny-target", "tiny-draft"):
        d = os.path.join(out_dir, "models", name)
        e = model_cases(d, prompts, 32, log)
        entries.append({"name": name, "dir": f"models/{name}", **e})

    rdir = os.path.join(data_dir, "models")
    rng = np.random.RandomState(args.seed)
    for i, (name, cls, theta, scaling, dtype, kw, plens, save_kw) in enumerate(
            _random_model_specs()):
        rprompts = [rng.randint(0, RANDOM_VOCAB, size=n).tolist() for n in plens]
        try:
            d, sizes = build_random_model(name, cls, theta, scaling, dtype, kw, save_kw, rdir,
                                          args.seed + 100 + i, log)
            e = model_cases(d, rprompts, 8, log)
        except Exception as ex:  # noqa: BLE001 - keep the other models' references
            import traceback

            log(f"ERROR: random model {name} failed: {ex!r}\n{traceback.format_exc()}")
            summary[f"random_{name}_error"] = repr(ex)
            continue
        entries.append({"name": name, "dir": f"tests/data/models/{name}", **e})
        summary[f"random_{name}_bytes"] = sum(sizes.values())

    _write_json(os.path.join(data_dir, "model_reference.json"), {
        "generator": generator,
        "method": "AutoModelForCausalLM.from_pretrained(dir, attn_implementation='eager')"
                  ".float() on the CPU, no grad. greedy_ids: argmax loop with full recompute "
                  "(no KV cache), eos does not stop it, torch.argmax (first index on ties). "
                  "first_logits: logits at the last prompt position, 6 significant digits.",
        "models": entries})
    log(f"model_reference.json: {len(entries)} models")
    summary["models"] = [e["name"] for e in entries]
    return summary
