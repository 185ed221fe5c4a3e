"""Policy checks over one rendered set of objects: what a schema cannot say.

Each rule takes the objects and the facts (metric catalog, image facts) and returns the
violations as lines a person can act on. RULES lists them all.
"""

import ipaddress

import network_policy
from workloads import (DEFAULT_DRAIN_S, DRAFTER, SERVER_SHUTDOWN_S, VERIFIER, binary, containers,
                       flags, name_of, named_port, namespace_of, of_kind, pod_labels, pod_spec,
                       port_number, selected, selects, treespec_containers, workloads)

GPU = "nvidia.com/gpu"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# Flags naming certificates, keys and token files (read at start by the binaries).
CREDENTIAL_FLAGS = ("tls_cert", "tls_key", "tls_client_ca", "drafter_tls_ca", "drafter_tls_cert",
                    "drafter_tls_key", "auth_token_file")


def _where(workload, container):
    return f"{name_of(workload)} container {container['name']}"


def _resources(container):
    res = container.get("resources") or {}
    return res.get("requests") or {}, res.get("limits") or {}


def extended_resources_equal(objs, facts):
    """GPUs (any vendor/resource) cannot be overcommitted: limits must equal requests."""
    for w in workloads(objs):
        for c in containers(w):
            requests, limits = _resources(c)
            for key in sorted(k for k in set(requests) | set(limits) if "/" in k):
                if str(requests.get(key)) != str(limits.get(key)):
                    yield (f"{_where(w, c)}: {key} limits {limits.get(key)} != requests "
                           f"{requests.get(key)}")


def gpus_match_flags(objs, facts):
    """--device=cuda wants the GPUs its ranks use (--tp for the verifier, 1 for the drafter);
    --device=cpu wants none."""
    for w, c, role in treespec_containers(objs):
        f = flags(w, c)
        device = f.get("device", "auto")
        gpus = int(_resources(c)[0].get(GPU, 0))
        if device == "cpu":
            want = 0
        elif device.startswith("cuda"):
            want = int(f.get("tp", "1")) if role == VERIFIER else 1
        else:
            yield f"{_where(w, c)}: --device={device}: name cpu or cuda in a manifest"
            continue
        if gpus != want:
            tp = f" --tp={f.get('tp', '1')}" if role == VERIFIER else ""
            yield (f"{_where(w, c)}: --device={device}{tp} needs {want} {GPU}, "
                   f"requests {gpus}")


def probes_use_container_ports(objs, facts):
    """Each service has startup, readiness and liveness probes on a port the container declares:
    native gRPC ones, except on a port that serves TLS (--tls_cert), which the kubelet's gRPC
    probe cannot speak: TCP connects there."""
    for w in workloads(objs):
        for c in containers(w):
            serves = binary(c) in (VERIFIER, DRAFTER)
            tls = serves and bool(flags(w, c).get("tls_cert"))
            for kind in PROBES:
                probe = c.get(kind)
                if probe is None:
                    if serves:
                        yield f"{_where(w, c)}: no {kind}"
                    continue
                if tls and "tcpSocket" not in probe:
                    yield (f"{_where(w, c)}: {kind} on a TLS port (--tls_cert): a native gRPC "
                           f"probe speaks plaintext and fails there, use tcpSocket")
                elif serves and not tls and "grpc" not in probe:
                    yield f"{_where(w, c)}: {kind} is not a native gRPC probe"
                handler = probe.get("grpc") or probe.get("httpGet") or probe.get("tcpSocket")
                if handler is not None and port_number(c, handler.get("port")) is None:
                    yield (f"{_where(w, c)}: {kind} port {handler.get('port')} is not a "
                           f"container port")


def flags_match_ports(objs, facts):
    """--host listens on every interface; --port and --metrics_port are the declared ports."""
    for w, c, _ in treespec_containers(objs):
        f = flags(w, c)
        if f.get("host") not in ("0.0.0.0", "[::]", "::"):
            yield (f"{_where(w, c)}: --host={f.get('host', '127.0.0.1 (default)')}: probes "
                   f"and peers reach the pod IP, listen on 0.0.0.0")
        for flag, port_name in (("port", "grpc"), ("metrics_port", "metrics")):
            declared = named_port(c, port_name)
            if str(declared) != f.get(flag):
                yield (f"{_where(w, c)}: --{flag}={f.get(flag)} but container port "
                       f"'{port_name}' is {declared}")


def _prestop_seconds(container):
    pre = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in pre:
        return int(pre["sleep"]["seconds"])
    command = (pre.get("exec") or {}).get("command") or []
    if len(command) == 2 and command[0] in ("sleep", "/bin/sleep"):
        return int(command[1])
    return None


def grace_covers_drain(objs, facts):
    """terminationGracePeriodSeconds >= preStop sleep + --drain_seconds + the server's final
    shutdown, or the kubelet kills requests that were still draining."""
    for w, c, role in treespec_containers(objs):
        pre = _prestop_seconds(c)
        if pre is None:
            yield (f"{_where(w, c)}: no preStop sleep (endpoint removal must reach clients "
                   f"before SIGTERM)")
            continue
        drain = int(flags(w, c).get("drain_seconds", DEFAULT_DRAIN_S[role]))
        need = pre + drain + SERVER_SHUTDOWN_S
        grace = pod_spec(w).get("terminationGracePeriodSeconds", 30)
        if grace < need:
            yield (f"{name_of(w)}: terminationGracePeriodSeconds {grace} < preStop {pre} + "
                   f"drain {drain} + shutdown {SERVER_SHUTDOWN_S} = {need}")


def selectors_match_templates(objs, facts):
    return [f"{name_of(w)}: spec.selector does not match the pod template's labels"
            for w in workloads(objs) if not selects(w["spec"].get("selector"), pod_labels(w))]


def services_reach_ports(objs, facts):
    """A Service selects pods, and each of its ports is a port of those pods; a headless
    Service's clients dial pod IPs, so its port must be the container port itself."""
    for svc in of_kind(objs, "Service"):
        spec = svc["spec"]
        targets = selected(objs, namespace_of(svc), spec.get("selector"))
        if not targets:
            yield f"{name_of(svc)}: selects no pods"
        for port in spec.get("ports", []):
            target = port.get("targetPort", port["port"])
            for w in targets:
                numbers = [port_number(c, target) for c in containers(w)]
                numbers = [n for n in numbers if n is not None]
                if not numbers:
                    yield (f"{name_of(svc)}: port {port['port']} (target {target}) is no "
                           f"container port of {name_of(w)}")
                elif spec.get("clusterIP") == "None" and port["port"] not in numbers:
                    yield (f"{name_of(svc)}: headless port {port['port']} != container port "
                           f"{numbers[0]} of {name_of(w)}")


def _split_target(target):
    """gRPC target -> (host, port): dns:///host:port, dns://server/host:port or host:port."""
    if target.startswith("dns:"):
        target = target[len("dns:"):].lstrip("/")
        if "/" in target:  # dns://server/host:port
            target = target.split("/", 1)[1]
    host, _, port = target.rpartition(":")
    return host, port


def drafter_target_is_a_service(objs, facts):
    """The verifier's --drafter names a Service (same cluster) that serves treespec-drafter pods
    on that port."""
    for w, c, role in treespec_containers(objs):
        target = flags(w, c).get("drafter", "") if role == VERIFIER else ""
        if not target:
            continue
        host, port = _split_target(target)
        try:
            ipaddress.ip_address(host)
            yield f"{_where(w, c)}: --drafter={target} is an address, not a Service"
            continue
        except ValueError:
            pass
        labels = host.split(".")
        svc_ns = labels[1] if len(labels) > 1 else namespace_of(w)
        services = [s for s in of_kind(objs, "Service")
                    if s["metadata"]["name"] == labels[0] and namespace_of(s) == svc_ns]
        if not services:
            yield (f"{_where(w, c)}: --drafter={target}: no Service {labels[0]} in namespace "
                   f"{svc_ns}")
            continue
        svc = services[0]
        if not port.isdigit() or int(port) not in [p["port"] for p in svc["spec"].get("ports", [])]:
            yield f"{_where(w, c)}: --drafter={target}: {name_of(svc)} has no port {port}"
        pods = selected(objs, svc_ns, svc["spec"].get("selector"))
        if not any(b == DRAFTER for _, _, b in treespec_containers(pods)):
            yield (f"{_where(w, c)}: --drafter={target}: {name_of(svc)} selects no "
                   f"{DRAFTER} pods")


def budgets_select_pods(objs, facts):
    return [f"{name_of(p)}: selects no pods" for p in of_kind(objs, "PodDisruptionBudget")
            if not selected(objs, namespace_of(p), p["spec"].get("selector"))]


def autoscalers_fit(objs, facts):
    """An HPA scales a Deployment that leaves `replicas` to it, on gauges its pods export."""
    for hpa in of_kind(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        found = [w for w in workloads(objs) if w["kind"] == ref["kind"]
                 and w["metadata"]["name"] == ref["name"]
                 and namespace_of(w) == namespace_of(hpa)]
        if not found:
            yield f"{name_of(hpa)}: no {ref['kind']}/{ref['name']} in its namespace"
            continue
        target = found[0]
        if "replicas" in target["spec"]:
            yield (f"{name_of(hpa)}: {name_of(target)} sets spec.replicas, which every "
                   f"`kubectl apply` would reset under the autoscaler")
        gauges = {name for _, _, b in treespec_containers([target])
                  for name, kind in facts.metrics.get(b, {}).items() if kind == "gauge"}
        for metric in hpa["spec"].get("metrics", []):
            if metric["type"] != "Pods":
                yield (f"{name_of(hpa)}: {metric['type']} metric: scale on the pods' own "
                       f"gauges (type Pods)")
                continue
            name = metric["pods"]["metric"]["name"]
            if name not in gauges:
                yield (f"{name_of(hpa)}: {name} is not a gauge that {name_of(target)} "
                       f"exports (known: {', '.join(sorted(gauges))})")


def monitors_scrape_metrics_ports(objs, facts):
    for mon in of_kind(objs, "PodMonitor"):
        targets = selected(objs, namespace_of(mon), mon["spec"].get("selector"))
        if not targets:
            yield f"{name_of(mon)}: selects no pods"
        for endpoint in mon["spec"].get("podMetricsEndpoints", []):
            for w in targets:
                if not any(named_port(c, endpoint.get("port")) for c in containers(w)):
                    yield (f"{name_of(mon)}: port '{endpoint.get('port')}' is no named "
                           f"container port of {name_of(w)}")


def gpu_pods_roll_in_place(objs, facts):
    """A pod holding a node's GPUs cannot surge: the new pod would find no free GPUs."""
    for w in of_kind(objs, "Deployment"):
        if not any(GPU in _resources(c)[0] for c in containers(w)):
            continue
        strategy = w["spec"].get("strategy") or {}
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            surge = (strategy.get("rollingUpdate") or {}).get("maxSurge", "25%")
            if str(surge) not in ("0", "0%"):
                yield (f"{name_of(w)}: GPU pods with maxSurge {surge}: full GPU nodes have "
                       f"no room for a surge pod (use maxSurge 0, maxUnavailable 1)")


def shm_in_memory(objs, facts):
    for w, c, _ in treespec_containers(objs):
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
        volumes = {v["name"]: v for v in pod_spec(w).get("volumes") or []}
        volume = volumes.get(mounts.get("/dev/shm"), {})
        if (volume.get("emptyDir") or {}).get("medium") != "Memory":
            yield f"{_where(w, c)}: /dev/shm is not an emptyDir of medium Memory"


def model_paths_exist(objs, facts):
    """--model and --draft_model are on a mounted volume or shipped in the image."""
    for w, c, _ in treespec_containers(objs):
        mounts = [m["mountPath"].rstrip("/") + "/" for m in c.get("volumeMounts") or []]
        for flag in ("model", "draft_model"):
            path = flags(w, c).get(flag)
            if not path:
                continue
            if not path.startswith("/"):
                path = facts.image_workdir.rstrip("/") + "/" + path
            if path not in facts.image_models and not any(path.startswith(m) for m in mounts):
                yield (f"{_where(w, c)}: --{flag}={path} is neither on a mounted volume nor "
                       f"shipped in the image ({', '.join(sorted(facts.image_models))})")


def runs_image_binaries_as_image_user(objs, facts):
    for w, c, _ in treespec_containers(objs):
        if c["command"][0] not in facts.image_binaries:
            yield f"{_where(w, c)}: command {c['command'][0]} is not in the image"
        security = pod_spec(w).get("securityContext") or {}
        if security.get("runAsNonRoot") is not True or security.get("runAsUser") != facts.image_uid:
            yield (f"{name_of(w)}: run as the image's non-root user: runAsNonRoot true, "
                   f"runAsUser {facts.image_uid}")


def _runs(workload, role):
    return any(b == role for _, _, b in treespec_containers([workload]))


def _peer_beyond_verifiers(objs, policy, peer):
    """(why `peer` admits more than verifier pods or None, whether it admits verifier pods)."""
    why = network_policy.beyond_namespace(peer)
    if why is not None:
        return why, True
    selector = peer.get("podSelector") or {}
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return "every pod of its namespace (an empty podSelector)", True
    pods = selected(objs, namespace_of(policy), selector)
    others = [name_of(p) for p in pods if not _runs(p, VERIFIER)]
    return (", ".join(others) if others else None), bool(pods)


def drafter_api_only_from_verifiers(objs, facts):
    """The internal Drafter API is reached by the verifier pods of its namespace and nobody
    else: no Service takes it out of the cluster, NetworkPolicies isolate the drafter pods and
    admit its port only from verifier pods (and do admit them: else speculation silently
    stops)."""
    for svc in of_kind(objs, "Service"):
        spec = svc["spec"]
        if not any(_runs(w, DRAFTER) for w in selected(objs, namespace_of(svc),
                                                        spec.get("selector"))):
            continue
        if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("externalIPs"):
            yield (f"{name_of(svc)}: exposes the Drafter port outside the cluster (type "
                   f"{spec.get('type', 'ClusterIP')}, externalIPs {spec.get('externalIPs', [])})")
    for w, c, role in treespec_containers(objs):
        if role != DRAFTER:
            continue
        where = f"{_where(w, c)}: Drafter port {named_port(c, 'grpc')}"
        admitted = network_policy.sources(objs, w, named_port(c, "grpc"))
        if admitted is None:
            yield f"{where} is open to every pod: no NetworkPolicy isolates the drafter pods"
            continue
        reached = False
        for policy, peer in admitted:
            why, reaches = _peer_beyond_verifiers(objs, policy, peer)
            if why is not None:
                yield f"{where} is open beyond verifier pods: {name_of(policy)} admits {why}"
            reached = reached or reaches
        if not reached:
            yield f"{where}: no NetworkPolicy lets the verifier pods reach it"


def pods_isolated(objs, facts):
    """Every treespec pod is selected by an Ingress NetworkPolicy (the base's default deny), so
    it accepts only the connections a policy allows."""
    return [f"{name_of(w)}: no NetworkPolicy isolates its ingress (base/network-policies.yaml)"
            for w in workloads(objs)
            if (_runs(w, VERIFIER) or _runs(w, DRAFTER))
            and not network_policy.isolating(objs, w)]


def policies_admit_clients(objs, facts):
    """The NetworkPolicies leave the verifier's public port open to someone, and each
    PodMonitor's port open to its scrapes."""
    wanted = [(w, named_port(c, "grpc"), "clients of the public API")
              for w, c, role in treespec_containers(objs) if role == VERIFIER]
    for mon in of_kind(objs, "PodMonitor"):
        for w in selected(objs, namespace_of(mon), mon["spec"].get("selector")):
            for endpoint in mon["spec"].get("podMetricsEndpoints", []):
                wanted += [(w, named_port(c, endpoint.get("port")), f"{name_of(mon)}'s scrapes")
                           for c in containers(w) if named_port(c, endpoint.get("port"))]
    for w, port, who in wanted:
        if network_policy.sources(objs, w, port) == []:
            yield f"{name_of(w)}: NetworkPolicies block {who}: no rule admits its port {port}"


def drafter_tls_sides_agree(objs, facts):
    """Each certificate flag comes with its key, and a verifier dials its namespace's drafters
    as they serve: TLS (--drafter_tls_ca) where they serve TLS (--tls_cert), a client
    certificate (--drafter_tls_cert) where, and only where, they check one (--tls_client_ca)."""
    for w, c, _ in treespec_containers(objs):
        f = flags(w, c)
        for cert, key in (("tls_cert", "tls_key"), ("drafter_tls_cert", "drafter_tls_key")):
            if bool(f.get(cert)) != bool(f.get(key)):
                yield f"{_where(w, c)}: --{cert} and --{key} go together"
    drafters = [(w, flags(w, c)) for w, c, role in treespec_containers(objs) if role == DRAFTER]
    for vw, vc, role in treespec_containers(objs):
        v = flags(vw, vc)
        if role != VERIFIER or not v.get("drafter"):
            continue
        for dw, d in (x for x in drafters if namespace_of(x[0]) == namespace_of(vw)):
            pair = f"{name_of(vw)} -> {name_of(dw)}"
            serves_tls, dials_tls = bool(d.get("tls_cert")), bool(v.get("drafter_tls_ca"))
            if serves_tls != dials_tls:
                yield (f"{pair}: the drafter serves {'TLS' if serves_tls else 'plaintext'} "
                       f"(--tls_cert) but the verifier dials {'TLS' if dials_tls else 'plaintext'}"
                       f" (--drafter_tls_ca)")
            checks, presents = bool(d.get("tls_client_ca")), bool(v.get("drafter_tls_cert"))
            if checks and not presents:
                yield (f"{pair}: the drafter requires client certificates (--tls_client_ca) but "
                       f"the verifier presents none (--drafter_tls_cert)")
            elif presents and not checks:
                yield (f"{pair}: the verifier presents a client certificate that the drafter "
                       f"never checks (no --tls_client_ca): not mutual TLS")


def credentials_from_secrets(objs, facts):
    """Certificates, keys and token files are read from a mounted Secret volume, which holds
    the file where the volume lists its items."""
    for w, c, _ in treespec_containers(objs):
        volumes = {v["name"]: v for v in pod_spec(w).get("volumes") or []}
        for flag in CREDENTIAL_FLAGS:
            path = flags(w, c).get(flag)
            if not path:
                continue
            mount = next((m for m in c.get("volumeMounts") or []
                          if path.startswith(m["mountPath"].rstrip("/") + "/")), None)
            secret = (volumes.get(mount["name"]) or {}).get("secret") if mount else None
            if secret is None:
                yield f"{_where(w, c)}: --{flag}={path} is not on a mounted Secret volume"
                continue
            name = path[len(mount["mountPath"].rstrip("/")) + 1:]
            items = [i["path"] for i in secret.get("items") or []]
            if items and name not in items:
                yield (f"{_where(w, c)}: --{flag}={path}: Secret volume {mount['name']} has no "
                       f"item {name} (items: {', '.join(items)})")


RULES = [extended_resources_equal, gpus_match_flags, probes_use_container_ports,
         flags_match_ports, grace_covers_drain, selectors_match_templates, services_reach_ports,
         drafter_target_is_a_service, budgets_select_pods, autoscalers_fit,
         monitors_scrape_metrics_ports, gpu_pods_roll_in_place, shm_in_memory, model_paths_exist,
         runs_image_binaries_as_image_user, drafter_api_only_from_verifiers, pods_isolated,
         policies_admit_clients, drafter_tls_sides_agree, credentials_from_secrets]


def violations(objs, facts):
    return [line for rule in RULES for line in rule(objs, facts)]
