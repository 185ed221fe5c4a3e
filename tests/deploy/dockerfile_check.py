"""Static checks of deploy/docker/Dockerfile, for a machine without a container engine.

Reads the Dockerfile as BuildKit would (line continuations, global ARGs in FROM) for each
VARIANT, and returns the facts the manifests must agree with: the image's user, working
directory, binaries and shipped model directories.
"""

import dataclasses
import fnmatch
import os
import pathlib
import re
import shlex

VARIANTS = ("cpu", "cuda")
BUILD_SCRIPTS = ("tools/install_deps.sh", "tools/build.sh")  # the README's build, verbatim


@dataclasses.dataclass
class ImageFacts:
    uid: int = -1
    workdir: str = "/"
    binaries: set = dataclasses.field(default_factory=set)  # absolute paths of the executables
    models: set = dataclasses.field(default_factory=set)  # model directories shipped (cpu)


def _instructions(text):
    """[(KEYWORD, rest)] with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _stages(instructions, variant):
    """{stage name: [(KEYWORD, rest)]} in order, FROM lines resolved for `variant`."""
    args = {}
    stages, current = {}, None
    for keyword, rest in instructions:
        if keyword == "ARG" and current is None:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            args["VARIANT"] = variant
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), rest.split()[0])
            name = rest.split()[-1] if " AS " in rest.upper() else f"stage{len(stages)}"
            current = name
            stages[name] = [("FROM", base)]
        elif current is not None:
            stages[current].append((keyword, rest))
    return stages


def _ignored(patterns, path):
    return any(fnmatch.fnmatch(path, p) for p in patterns if not p.startswith("!"))


def check(repo, dockerfile_text, ignore_text):
    """Returns (errors, ImageFacts of the final stage) for the Dockerfile text given."""
    repo = pathlib.Path(repo)
    errors, facts = [], ImageFacts()
    instructions = _instructions(dockerfile_text)
    patterns = [p.strip() for p in ignore_text.splitlines() if p.strip() and p[0] != "#"]
    for path in (".git", "build", "build-deploy"):
        if not _ignored(patterns, path):
            errors.append(f"Dockerfile.dockerignore: does not leave out {path}/ (a host build "
                          f"tree's CMakeCache.txt breaks the image's configure)")
    for variant in VARIANTS:
        stages = _stages(instructions, variant)
        names = list(stages)
        for index, (name, body) in enumerate(stages.items()):
            base = body[0][1]
            if base not in names[:index] and ":" not in base and "@" not in base:
                errors.append(f"[{variant}] stage {name}: FROM {base} is neither an earlier stage "
                              f"nor a tagged image")
            for keyword, rest in body[1:]:
                errors += _check_step(repo, variant, name, names, keyword, rest)
        build_runs = " ".join(rest for k, rest in stages.get("build", []) if k == "RUN")
        for script in BUILD_SCRIPTS:
            if script not in build_runs:
                errors.append(f"[{variant}] stage build: does not run {script}")
        final = stages[names[-1]]
        users = [rest for k, rest in final if k == "USER"]
        uid = users[-1].split(":")[0] if users else "root"
        if not uid.isdigit() or int(uid) == 0:
            errors.append(f"[{variant}] final stage {names[-1]}: USER {uid} is root or not numeric "
                          f"(Kubernetes can only check runAsNonRoot for a numeric uid)")
        else:
            facts.uid = int(uid)
        workdirs = [rest for k, rest in final if k == "WORKDIR"]
        facts.workdir = workdirs[-1] if workdirs else "/"
        facts.binaries |= _binaries(stages)
        if variant == "cpu":
            facts.models = {shlex.split(rest)[-1] for k, rest in _chain(stages, names[-1])
                            if k == "COPY" and "/models/" in rest and "--from" not in rest}
    return errors, facts


def _chain(stages, name):
    """The instructions of a stage and of the stages it is built FROM, base first."""
    body = stages.get(name, [])
    base = body[0][1] if body else ""
    return (_chain(stages, base) if base in stages else []) + body


def _check_step(repo, variant, stage, names, keyword, rest):
    errors = []
    words = shlex.split(rest) if keyword in ("COPY", "ADD") else rest.split()
    if keyword in ("COPY", "ADD"):
        options = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        source_stage = [o.split("=", 1)[1] for o in options if o.startswith("--from=")]
        if source_stage:
            if source_stage[0] not in names:
                errors.append(f"[{variant}] stage {stage}: COPY --from={source_stage[0]}: "
                              f"no such stage")
        else:
            for source in paths[:-1]:
                if not (repo / source).exists() and not any(repo.glob(source)):
                    errors.append(f"[{variant}] stage {stage}: COPY {source}: not in the repo")
    if keyword == "RUN":
        for word in words:
            if re.fullmatch(r"(tools|deploy)/[\w./-]+\.sh", word):
                script = repo / word
                if not script.is_file() or not os.access(script, os.X_OK):
                    errors.append(f"[{variant}] stage {stage}: RUN {word}: not an executable "
                                  f"script of the repo")
    return errors


def _binaries(stages):
    """Absolute paths of the binaries the final stage installs: stage_runtime.sh OUT BIN... in the
    build stage, copied with COPY --from=build OUT DEST, land in DEST/bin/."""
    staged = {}
    for keyword, rest in stages.get("build", []):
        words = rest.split()
        if keyword == "RUN" and words and words[0].endswith("stage_runtime.sh"):
            staged[words[1]] = [os.path.basename(w) for w in words[2:]]
    found = set()
    for body in stages.values():
        for keyword, rest in body:
            words = rest.split()
            if keyword == "COPY" and "--from=build" in words and words[-2] in staged:
                found |= {f"{words[-1]}/bin/{b}" for b in staged[words[-2]]}
    return found
