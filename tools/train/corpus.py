"""Corpus for the tiny pair: every Python source of the running interpreter.

The standard library plus the site-packages of the interpreter's environment, found through
`sysconfig` and `site`. A fixed, seeded sample of standard-library modules is held out and never
trained on (exact duplicates anywhere else are dropped too, because files are deduplicated by
content and the standard library is walked first).

This module needs only the Python standard library until `train_tokenizer` / `tokenize_docs`
are called (those import `tokenizers` and `numpy`), so file discovery can be tried anywhere.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import site
import sysconfig
from dataclasses import dataclass

SKIP_DIR_NAMES = {"__pycache__", "site-packages", "dist-packages", ".git"}
TEST_DIR_NAMES = {"test", "tests", "idle_test", "testing"}


@dataclass
class SourceFile:
    kind: str      # "stdlib" or "site"
    root: str      # the root it was found under
    rel: str       # path relative to root
    text: str


def source_roots() -> tuple[str, list[str]]:
    """(stdlib dir, [site-packages dirs]) of the running interpreter."""
    paths = sysconfig.get_paths()
    stdlib = os.path.realpath(paths["stdlib"])
    cands = [paths.get("purelib"), paths.get("platlib")]
    try:
        cands += list(site.getsitepackages())
    except AttributeError:  # old virtualenvs
        pass
    site_dirs: list[str] = []
    for p in cands:
        if p and os.path.isdir(p):
            rp = os.path.realpath(p)
            if rp != stdlib and rp not in site_dirs:
                site_dirs.append(rp)
    return stdlib, site_dirs


def _walk_py(root: str, max_file_bytes: int) -> list[tuple[str, int]]:
    """Sorted (relpath, size) of *.py files under root, not descending into SKIP_DIR_NAMES."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIR_NAMES)
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            full = os.path.join(dirpath, f)
            if os.path.islink(full):
                continue
            try:
                size = os.path.getsize(full)
            except OSError:
                continue
            if 0 < size <= max_file_bytes:
                out.append((os.path.relpath(full, root), size))
    out.sort()
    return out


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def is_test_path(rel: str) -> bool:
    parts = rel.split(os.sep)
    return any(p in TEST_DIR_NAMES for p in parts[:-1]) or parts[-1].startswith("test_")


def select_heldout(stdlib_listing: list[tuple[str, int]], frac: float, seed: int,
                   min_files: int = 24) -> list[str]:
    """A fixed, seeded ~frac of the standard library's files (by count), drawn from ordinary
    modules (no test directories, 2 KB to 200 KB) so that held-out text is real library code."""
    cands = [rel for rel, size in stdlib_listing
             if not is_test_path(rel) and 2_000 <= size <= 200_000]
    k = max(min_files, int(round(frac * len(stdlib_listing))))
    k = min(k, len(cands))
    rng = random.Random(seed)
    return sorted(rng.sample(sorted(cands), k))


@dataclass
class Corpus:
    stdlib_root: str
    site_roots: list[str]
    train: list[SourceFile]
    heldout: list[SourceFile]
    n_stdlib_files: int
    n_site_files: int
    n_duplicates: int
    n_unreadable: int
    uncapped_train_bytes: int = 0

    def train_bytes(self) -> int:
        return sum(len(f.text.encode("utf-8")) for f in self.train)

    def heldout_bytes(self) -> int:
        return sum(len(f.text.encode("utf-8")) for f in self.heldout)


def discover(heldout_frac: float = 0.02, seed: int = 1234, max_file_bytes: int = 1_000_000,
             include_site: bool = True, max_train_bytes: int = 0) -> Corpus:
    stdlib, site_dirs = source_roots()
    std_listing = _walk_py(stdlib, max_file_bytes)
    heldout_rel = set(select_heldout(std_listing, heldout_frac, seed))

    seen_hash: set[bytes] = set()
    seen_real: set[str] = set()
    train: list[SourceFile] = []
    heldout: list[SourceFile] = []
    dups = unreadable = n_site = 0

    def add(kind: str, root: str, rel: str) -> None:
        nonlocal dups, unreadable
        full = os.path.join(root, rel)
        real = os.path.realpath(full)
        if real in seen_real:
            dups += 1
            return
        seen_real.add(real)
        text = _read_text(full)
        if text is None or not text.strip():
            unreadable += 1
            return
        h = hashlib.sha1(text.encode("utf-8")).digest()
        if h in seen_hash:
            dups += 1
            return
        seen_hash.add(h)
        sf = SourceFile(kind, root, rel, text)
        if kind == "stdlib" and rel in heldout_rel:
            heldout.append(sf)
        else:
            train.append(sf)

    # Held-out files first, so that a copy of one elsewhere is a duplicate and never trained on.
    for rel, _ in std_listing:
        if rel in heldout_rel:
            add("stdlib", stdlib, rel)
    for rel, _ in std_listing:
        if rel not in heldout_rel:
            add("stdlib", stdlib, rel)
    if include_site:
        for root in site_dirs:
            listing = _walk_py(root, max_file_bytes)
            n_site += len(listing)
            for rel, _ in listing:
                add("site", root, rel)

    heldout.sort(key=lambda f: f.rel)
    uncapped = sum(len(f.text.encode("utf-8")) for f in train)
    if max_train_bytes > 0:
        rng = random.Random(seed + 1)
        order = list(range(len(train)))
        rng.shuffle(order)
        kept, total = [], 0
        for i in order:
            n = len(train[i].text.encode("utf-8"))
            if total + n > max_train_bytes:
                continue
            kept.append(i)
            total += n
        train = [train[i] for i in sorted(kept)]
    return Corpus(stdlib, site_dirs, train, heldout, len(std_listing), n_site, dups, unreadable,
                  uncapped)


def discover_heldout_only(heldout_frac: float = 0.02, seed: int = 1234,
                          max_file_bytes: int = 1_000_000) -> list[SourceFile]:
    """The same held-out files as discover() picks, without reading the rest."""
    stdlib, _ = source_roots()
    std_listing = _walk_py(stdlib, max_file_bytes)
    out = []
    for rel in select_heldout(std_listing, heldout_frac, seed):
        text = _read_text(os.path.join(stdlib, rel))
        if text is not None and text.strip():
            out.append(SourceFile("stdlib", stdlib, rel, text))
    return out


# ---------------------------------------------------------------------------------------------
# Snippets of held-out code (prompts for the demo and the model references).

_DEF_RE = re.compile(r"^(?:    )?(?:async def|def|class) \w", re.M)


def _cut(text: str, start: int, min_chars: int, max_chars: int) -> str | None:
    """text[start:...] ending at a line end, min_chars <= len <= max_chars."""
    end_limit = min(len(text), start + max_chars)
    piece = text[start:end_limit]
    # last newline within the piece that is past min_chars
    cut = piece.rfind("\n")
    if cut + 1 >= min_chars:
        return piece[:cut + 1]
    if len(piece) >= min_chars and end_limit == len(text):
        return piece
    return None


def heldout_snippets(files: list[SourceFile], n: int, seed: int = 7,
                     min_chars: int = 200, max_chars: int = 600) -> list[dict]:
    """Up to n snippets: the beginnings of functions/classes (or of the file) in held-out files,
    at most two per file, in a seeded order. Each is {"file": rel, "text": ...}."""
    per_file: list[list[dict]] = []
    for f in files:
        picks = []
        starts = [m.start() for m in _DEF_RE.finditer(f.text)]
        rng = random.Random(f"{seed}:{f.rel}")
        if starts:
            chosen = sorted(rng.sample(starts, min(2, len(starts))))
        else:
            chosen = [0]
        for s in chosen:
            t = _cut(f.text, s, min_chars, rng.randint((min_chars + max_chars) // 2, max_chars))
            if t is not None and "\x00" not in t:
                picks.append({"file": f.rel, "text": t})
        if picks:
            per_file.append(picks)
    out: list[dict] = []
    # first one snippet per file, then the second ones
    for round_ in range(2):
        for picks in per_file:
            if len(out) >= n:
                return out
            if round_ < len(picks):
                out.append(picks[round_])
    return out


# ---------------------------------------------------------------------------------------------
# Tokenizer training and corpus tokenization (need `tokenizers`, `numpy`).

EOT = "<|endoftext|>"


def train_tokenizer(texts_iter, vocab_size: int = 4096):
    """GPT-2-style byte-level BPE: ByteLevel pre-tokenizer (add_prefix_space=False,
    use_regex=True), ByteLevel decoder, BPE model; `<|endoftext|>` is special token id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts_iter, trainer=trainer)
    assert tok.token_to_id(EOT) == 0, tok.token_to_id(EOT)
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size, tok.get_vocab_size()
    return tok


def tokenize_docs(tok, texts: list[str], eos_id: int, batch_docs: int = 4096):
    """One uint16 stream: EOS doc EOS doc ... EOS. Special-token strings inside the documents
    are encoded as plain text (encode_special_tokens), so id 0 only ever separates documents."""
    import numpy as np
    from tokenizers import Tokenizer

    t = Tokenizer.from_str(tok.to_str())
    if hasattr(t, "encode_special_tokens"):
        t.encode_special_tokens = True
    enc = getattr(t, "encode_batch_fast", None) or t.encode_batch
    parts = []
    eos = np.array([eos_id], dtype=np.uint16)
    for i in range(0, len(texts), batch_docs):
        for e in enc(texts[i:i + batch_docs], add_special_tokens=False):
            parts.append(eos)
            parts.append(np.asarray(e.ids, dtype=np.uint16))
    parts.append(eos)
    return np.concatenate(parts)
