"""What the policy checks read off rendered objects: pod templates, containers, flags, selectors."""

import os
import re

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
VERIFIER, DRAFTER = "treespec-verifier", "treespec-drafter"
# Both mains end with server->Shutdown(now + 5 s) after their drain (verifier_main.cc,
# drafter_main.cc): part of every grace period.
SERVER_SHUTDOWN_S = 5
# --drain_seconds default of the verifier (verifier_main.cc); the drafter has no drain of its own.
DEFAULT_DRAIN_S = {VERIFIER: 30, DRAFTER: 30}

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def name_of(obj):
    return f"{obj['kind']}/{obj['metadata']['name']}"


def namespace_of(obj):
    return obj["metadata"].get("namespace")


def workloads(objs):
    return [o for o in objs if o.get("kind") in WORKLOAD_KINDS]


def of_kind(objs, kind):
    return [o for o in objs if o.get("kind") == kind]


def pod_spec(workload):
    return workload["spec"]["template"].get("spec", {})


def pod_labels(workload):
    return workload["spec"]["template"].get("metadata", {}).get("labels", {})


def containers(workload):
    return pod_spec(workload).get("containers", [])


def binary(container):
    """The treespec binary a container runs (basename of command[0]), or None."""
    command = container.get("command") or []
    return os.path.basename(command[0]) if command else None


def selects(selector, labels):
    """Kubernetes label-selector semantics: {} selects everything, None selects nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def selected(objs, namespace, selector):
    """Workloads in `namespace` whose pods `selector` selects (a Service's plain map included)."""
    if selector is not None and "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    return [w for w in workloads(objs)
            if namespace_of(w) == namespace and selects(selector, pod_labels(w))]


def flags(workload, container):
    """The container's `--name=value` args with $(VAR) expanded as the kubelet does; the last
    occurrence of a flag wins, as in absl."""
    env = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[var["name"]] = namespace_of(workload) or "default"
    found = {}
    for arg in container.get("args") or []:
        arg = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), arg)
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            found[key] = value
    return found


def port_number(container, port):
    """The containerPort a probe's or Service's port (number or name) means, or None."""
    for declared in container.get("ports") or []:
        if port in (declared.get("containerPort"), declared.get("name")):
            return declared["containerPort"]
    return None


def named_port(container, name):
    for declared in container.get("ports") or []:
        if declared.get("name") == name:
            return declared["containerPort"]
    return None


def treespec_containers(objs):
    """(workload, container, binary) for every container that runs a treespec service."""
    return [(w, c, binary(c)) for w in workloads(objs) for c in containers(w)
            if binary(c) in (VERIFIER, DRAFTER)]
