#!/usr/bin/env python3
"""Generates docs/flags.md from every treespec binary's --helpfull.

    tools/gen_flags_md.py [--bin_dir build/bin]           # rewrite docs/flags.md
    tools/gen_flags_md.py [--bin_dir build/bin] --check   # exit 1 if it is out of date

Only the flags a binary defines in this repository are listed (Abseil's own --flagfile,
--fromenv, ... are left out). --check compares the section of every binary that was built: a
build without CUDA has no GPU benchmarks, and their sections are then kept as they are.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "flags.md")
# In the order a user meets them: the services, the clients, the tools, the benchmarks.
BINARIES = [
    "treespec-verifier", "treespec-drafter", "treespec-cli", "treespec-loadgen",
    "treespec-random-model", "treespec-forward-bench", "treespec-drafter-bench",
    "treespec-verify-step-bench", "treespec-attention-bench", "treespec-gemm-bench",
    "treespec-gpu-ceilings", "treespec-feature-wire-bench",
]
HEADER = """# Flags

Every flag of every treespec binary, generated from its `--helpfull` by
`tools/gen_flags_md.py` (do not edit by hand: `ctest -R flags_doc` fails when a flag changes
and this page was not regenerated). [usage.md](usage.md) says which flags matter and when.
"""


def repo_source(path):
    """The repository-relative path of a 'Flags from PATH:' source, or None if not ours."""
    parts = path.strip("./").split("/")
    for i in range(len(parts)):
        candidate = "/".join(parts[i:])
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return candidate
    return None


def parse(help_text):
    """(description line, [(source, [(flag, default, what)])]) from --helpfull's output."""
    lines = help_text.splitlines()
    usage = lines[0].split(":", 1)[1].strip() if lines and ":" in lines[0] else ""
    sections, current, entry = [], None, None

    def finish():
        if entry is not None and current is not None:
            text = " ".join(entry)
            m = re.match(r"--(\S+) \((.*)\); default: (.*);$", text)
            if not m:
                sys.exit(f"gen_flags_md: cannot parse flag help: {text!r}")
            current[1].append((m.group(1), m.group(3), m.group(2)))

    for line in lines[1:]:
        m = re.match(r"  Flags from (.*):$", line)
        if m:
            finish()
            entry = None
            source = repo_source(m.group(1))
            current = (source, []) if source else None
            if current:
                sections.append(current)
        elif line.startswith("    --"):
            finish()
            entry = [line.strip()]
        elif line.startswith("      ") and entry is not None:
            entry.append(line.strip())
    finish()
    return usage, sections


def section(binary, bin_dir):
    path = os.path.join(bin_dir, binary)
    if not os.access(path, os.X_OK):
        return None
    result = subprocess.run([path, "--helpfull"], capture_output=True, text=True, timeout=60)
    usage, sources = parse(result.stdout + result.stderr)
    out = [f"## {binary}", "", usage, ""]
    for source, flags in sources:
        out += [f"Defined in `{source}`.", "", "| flag | default | what |", "|---|---|---|"]
        for name, default, what in sorted(flags):
            cell = what.replace("|", "\\|")
            out.append(f"| `--{name}` | `{default}` | {cell} |")
        out.append("")
    return "\n".join(out)


def split_sections(text):
    """{binary: its section text} of an existing flags.md."""
    found = {}
    for chunk in re.split(r"\n(?=## )", text):
        m = re.match(r"## (\S+)", chunk)
        if m:
            found[m.group(1)] = chunk.rstrip("\n")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin_dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    old = open(OUT).read() if os.path.exists(OUT) else ""
    kept = split_sections(old)
    parts, stale, missing = [], [], []
    for binary in BINARIES:
        text = section(binary, args.bin_dir)
        if text is None:
            missing.append(binary)
            text = kept.get(binary)
            if text is None:
                continue
        elif kept.get(binary) != text.rstrip("\n"):
            stale.append(binary)
        parts.append(text.rstrip("\n"))
    new = HEADER + "\n" + "\n\n".join(parts) + "\n"
    if missing:
        print(f"gen_flags_md: not built here, section kept as it was: {', '.join(missing)}")
    if args.check:
        if stale or new != old:
            sys.exit("gen_flags_md: docs/flags.md is out of date for "
                     f"{', '.join(stale) or 'its layout'}; run tools/gen_flags_md.py")
        return
    open(OUT, "w").write(new)


if __name__ == "__main__":
    main()
