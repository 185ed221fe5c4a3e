"""What the rendered NetworkPolicies let into a pod, with Kubernetes' semantics.

A pod that no policy of type Ingress selects accepts every connection. Once one does, it accepts
only what some rule of some policy selecting it allows (policies add up). A rule allows its
`from` peers (none listed: every source) on its `ports` (none listed: every port).
"""

from workloads import containers, named_port, namespace_of, of_kind, pod_labels, selects

EVERY_SOURCE = None  # the peer of a rule without `from`


def isolating(objs, workload):
    """The Ingress NetworkPolicies that select `workload`'s pods."""
    return [p for p in of_kind(objs, "NetworkPolicy")
            if namespace_of(p) == namespace_of(workload)
            and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
            and selects(p["spec"].get("podSelector"), pod_labels(workload))]


def _covers(workload, rule_port, port):
    """Whether a rule's port entry (number, number range or container port name) means TCP
    `port` of the pod."""
    if rule_port.get("protocol", "TCP") != "TCP":
        return False
    value = rule_port.get("port")
    if value is None:
        return True
    if isinstance(value, int):
        return value <= port <= rule_port.get("endPort", value)
    return any(named_port(c, value) == port for c in containers(workload))


def sources(objs, workload, port):
    """Who may connect to TCP `port` of `workload`'s pods: None when no policy isolates them
    (anyone), else [(policy, peer)] for every allowing rule's peers (EVERY_SOURCE for a rule
    without `from`); an empty list means nobody."""
    policies = isolating(objs, workload)
    if not policies:
        return None
    found = []
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(_covers(workload, p, port) for p in ports):
                continue
            found.extend((policy, peer) for peer in rule.get("from") or [EVERY_SOURCE])
    return found


def beyond_namespace(peer):
    """Why `peer` admits sources outside its policy's namespace, or None."""
    if peer is EVERY_SOURCE:
        return "every source (a rule without `from`)"
    if "ipBlock" in peer:
        return f"addresses {peer['ipBlock'].get('cidr')} (ipBlock)"
    if "namespaceSelector" in peer:
        return "pods of other namespaces (namespaceSelector)"
    return None
