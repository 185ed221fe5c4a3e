"""Strict JSON-schema validation of Kubernetes objects, offline.

The schemas come from npm packages that ship the Kubernetes OpenAPI definitions as plain JSON
Schema literals: kubernetes-models 4.3.1 (Kubernetes 1.27: its later releases ship compiled
validators instead, which accept unknown fields), @kubernetes-models/apimachinery 1.2.2
(ObjectMeta, LabelSelector, Quantity, ...) and @kubernetes-models/prometheus-operator 4.0.0 (the
PodMonitor/ServiceMonitor CRD schemas). Each
`_schemas/*.js` (or CRD model .js) file holds `const schema = {...};` and registers it under an
id such as "io.k8s.api.apps.v1.Deployment"; references look like {"$ref": "<id>#"}.

Made strict the way `kubectl --validate=strict` behaves: every object schema that lists
`properties` rejects any other property (unknown fields), unless it says otherwise.
"""

import json
import pathlib
import re

import jsonschema

_SCHEMA = re.compile(r"^const schema = (\{.*?^\});$", re.S | re.M)
_ID = re.compile(r'register\)\("([^"]+)", schema\)|^const schemaId = "([^"]+)";', re.M)


def _load_definitions(package_dirs):
    """Returns {schema id: schema} from every .js file of the given unpacked packages."""
    defs = {}
    for root in package_dirs:
        for path in pathlib.Path(root).rglob("*.js"):
            text = path.read_text(encoding="utf-8")
            body, ident = _SCHEMA.search(text), _ID.search(text)
            if body and ident:
                defs[ident.group(1) or ident.group(2)] = json.loads(body.group(1))
    return defs


def _strict(node):
    """Rewrites one schema in place: local $refs, no null alternatives, unknown fields rejected."""
    if isinstance(node, list):
        for item in node:
            _strict(item)
        return
    if not isinstance(node, dict):
        return
    one_of = node.get("oneOf")
    # {"oneOf": [X, {"type": "null"}]} -> X: clearer errors; our manifests never write null.
    if isinstance(one_of, list) and len(one_of) == 2 and one_of[1] == {"type": "null"}:
        del node["oneOf"]
        node.update(one_of[0])
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.endswith("#") and not ref.startswith("#"):
        node["$ref"] = "#/definitions/" + ref[:-1]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        node["additionalProperties"] = False
    for key, value in node.items():
        if key != "enum":
            _strict(value)


class SchemaSet:
    """Validators for every (apiVersion, kind) that the packages define."""

    def __init__(self, package_dirs):
        self._defs = _load_definitions(package_dirs)
        if not self._defs:
            raise RuntimeError(f"no schemas found under {package_dirs}")
        for schema in self._defs.values():
            _strict(schema)
        self._kinds = {}
        for ident, schema in self._defs.items():
            props = schema.get("properties", {})
            versions = props.get("apiVersion", {}).get("enum", [])
            kinds = props.get("kind", {}).get("enum", [])
            if len(versions) == 1 and len(kinds) == 1:
                self._kinds[(versions[0], kinds[0])] = ident
        self._validators = {}

    def __len__(self):
        return len(self._kinds)

    def errors(self, obj):
        """Returns the schema violations of one object as readable lines (empty when valid)."""
        key = (obj.get("apiVersion"), obj.get("kind"))
        ident = self._kinds.get(key)
        if ident is None:
            return [f"no schema for apiVersion {key[0]} kind {key[1]}"]
        if ident not in self._validators:
            root = {"$ref": "#/definitions/" + ident, "definitions": self._defs}
            self._validators[ident] = jsonschema.Draft7Validator(root)
        found = []
        for error in self._validators[ident].iter_errors(obj):
            best = jsonschema.exceptions.best_match([error])
            path = "/".join(str(p) for p in best.absolute_path) or "(root)"
            found.append(f"{path}: {best.message}")
        return sorted(found)
