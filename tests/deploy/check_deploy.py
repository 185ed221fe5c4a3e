"""Checks deploy/ without a cluster or a container engine (run by run_checks.sh, ctest `deploy`).

1. Every overlay, alone, with each component, each pair of components and all of them, renders
   with `kubectl kustomize`; every object validates against the Kubernetes schemas with unknown
   fields rejected, and passes the policy checks (policy.py).
2. The Dockerfile passes its static checks (dockerfile_check.py), and the manifests agree with
   the image (user, binaries, shipped models).
3. deploy/README.md names only metrics the services export.
4. The checker can fail: each fixture under fixtures/ (a broken manifest) and each Dockerfile
   mutation in fixtures/dockerfile_mutations.yaml must be rejected with the message it expects.
Prints one line per check and closes with "N passed, M failed".
"""

import argparse
import itertools
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types

import yaml

import dockerfile_check
import metric_catalog
import policy
from k8s_schemas import SchemaSet

HERE = pathlib.Path(__file__).resolve().parent


class Tally:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def report(self, what, problems):
        if problems:
            self.failed += 1
            print(f"FAIL {what}")
            for line in problems:
                print(f"     {line}")
        else:
            self.passed += 1
            print(f"ok   {what}")


def render(kubectl, directory):
    run = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True,
                         check=False)
    if run.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory}: {run.stderr.strip()}")
    return [o for o in yaml.safe_load_all(run.stdout) if o]


def problems_of(kubectl, directory, schemas, facts):
    try:
        objs = render(kubectl, directory)
    except RuntimeError as e:
        return [str(e)]
    found = [f"{o.get('kind')}/{o.get('metadata', {}).get('name')}: {line}"
             for o in objs for line in schemas.errors(o)]
    return found + policy.violations(objs, facts)


def combinations(k8s):
    """Yields (label, overlay dir) with the overlay's kustomization set to no component, each
    one, each pair and all of them, in `k8s`, a scratch copy of deploy/k8s. Components meet in
    pairs (two patches on one list or field), so pairs catch what every subset would, at a
    fraction of the renders (2^n grows past the test's time limit with 5 components)."""
    components = sorted(p.name for p in (k8s / "components").iterdir() if p.is_dir())
    subsets = [c for count in range(min(2, len(components)) + 1)
               for c in itertools.combinations(components, count)]
    if len(components) > 2:
        subsets.append(tuple(components))
    for overlay in sorted(p for p in (k8s / "overlays").iterdir() if p.is_dir()):
        path = overlay / "kustomization.yaml"
        original = yaml.safe_load(path.read_text())
        for chosen in subsets:
            kustomization = dict(original)
            kustomization["components"] = (original.get("components", []) +
                                           [f"../../components/{c}" for c in chosen])
            path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
            yield " + ".join([f"overlays/{overlay.name}", *chosen]), overlay


def expected_failure(problems, expect):
    if not problems:
        return [f"accepted, but should fail with '{expect}'"]
    if not any(expect in line for line in problems):
        return [f"failed, but not with '{expect}':", *problems]
    return []


def check_readme_metrics(repo, facts):
    known = metric_catalog.series_names(facts.metrics)
    text = (repo / "deploy" / "README.md").read_text(encoding="utf-8")
    return [f"deploy/README.md names {name}, which no service exports"
            for name in sorted(set(re.findall(r"\btreespec_[a-z_]+[a-z]", text)) - known)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", type=pathlib.Path, required=True)
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--schemas", nargs="+", required=True, help="unpacked schema packages")
    args = parser.parse_args()
    repo, tally = args.repo.resolve(), Tally()

    schemas = SchemaSet(args.schemas)
    print(f"schemas: {len(schemas)} kinds; kubectl: {args.kubectl}")
    docker = repo / "deploy" / "docker"
    dockerfile, ignore = ((docker / n).read_text() for n in ("Dockerfile",
                                                             "Dockerfile.dockerignore"))
    errors, image = dockerfile_check.check(repo, dockerfile, ignore)
    tally.report("deploy/docker/Dockerfile (static)", errors)
    facts = types.SimpleNamespace(metrics=metric_catalog.catalog(repo), image_uid=image.uid,
                                  image_workdir=image.workdir, image_binaries=image.binaries,
                                  image_models=image.models)
    tally.report("deploy/README.md metric names", check_readme_metrics(repo, facts))

    with tempfile.TemporaryDirectory() as scratch:
        k8s = pathlib.Path(scratch) / "k8s"
        shutil.copytree(repo / "deploy" / "k8s", k8s)
        for label, directory in combinations(k8s):
            tally.report(f"render + validate {label}", problems_of(args.kubectl, directory,
                                                                   schemas, facts))

    for fixture in sorted(p for p in (HERE / "fixtures").iterdir() if p.is_dir()):
        first = (fixture / "kustomization.yaml").read_text().splitlines()[0]
        expect = first.removeprefix("# expect:").strip()
        problems = problems_of(args.kubectl, fixture, schemas, facts)
        tally.report(f"rejects fixture {fixture.name}", expected_failure(problems, expect))

    mutations = yaml.safe_load((HERE / "fixtures" / "dockerfile_mutations.yaml").read_text())
    for m in mutations:
        text = {"Dockerfile": dockerfile, "Dockerfile.dockerignore": ignore}
        assert m["old"] in text[m["file"]], f"mutation {m['name']}: '{m['old']}' not found"
        text[m["file"]] = text[m["file"]].replace(m["old"], m["new"])
        errors, _ = dockerfile_check.check(repo, text["Dockerfile"],
                                           text["Dockerfile.dockerignore"])
        tally.report(f"rejects Dockerfile mutation {m['name']}",
                     expected_failure(errors, m["expect"]))

    print(f"{tally.passed} passed, {tally.failed} failed")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
