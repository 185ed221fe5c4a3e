"""The Prometheus metrics each service exports, read from their sources, so manifests and docs can
only name real ones."""

import pathlib
import re

from workloads import DRAFTER, VERIFIER

SOURCES = {VERIFIER: "verifier_service/serving_metrics.cc",
           DRAFTER: "drafter_service/drafter_metrics.cc"}


def catalog(repo):
    """{binary: {metric name: "gauge" | "histogram" | "counter"}}."""
    out = {}
    for binary, source in SOURCES.items():
        text = (pathlib.Path(repo) / source).read_text(encoding="utf-8")
        gauges = set(re.findall(r'GaugeFamily\(\s*"(treespec_\w+)"', text))
        histograms = set(re.findall(r'BuildHistogram\(\)\s*\.Name\("(treespec_\w+)"\)', text))
        out[binary] = {name: "gauge" if name in gauges else
                       "histogram" if name in histograms else "counter"
                       for name in re.findall(r'"(treespec_\w+)"', text)}
        if not gauges or not histograms:
            raise RuntimeError(f"{source}: found no gauges or histograms; has the metrics code "
                               f"changed shape? (tests/deploy/metric_catalog.py)")
    return out


def series_names(catalog_of):
    """Every series name Prometheus stores: histograms add _bucket, _sum and _count."""
    names = set()
    for metrics in catalog_of.values():
        for name, kind in metrics.items():
            names.add(name)
            if kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names
