"""The CustomResourceDefinitions of the kinds we ship, vendored verbatim, as strict validators.

``components/kube/crds/`` holds the upstream CRD files byte for byte; ``SOURCES.json`` names,
for each, the repository, the release ref, the commit, the path and the file's sha256, which is
checked before a file is used (an edited copy is refused, not trusted):

* KServe ``v0.20.0``, ``config/crd/full/``: InferenceService, ServingRuntime,
  ClusterServingRuntime, ClusterStorageContainer;
* Kubeflow training-operator ``release-1.9``, ``manifests/base/crds/``: PaddleJob;
* sigstore policy-controller ``v0.9.0``, ``config/``: ClusterImagePolicy (k8s/policy);
* Katib ``v0.19.0``: ``manifests/v1beta1/components/crd/experiment.yaml`` (Experiment) and
  ``api/openapi-spec/swagger.json``, the OpenAPI 3.0 schemas generated from Katib's Go types.

To update one: copy the new upstream file over it, update its row in ``SOURCES.json`` (ref,
commit, sha256) and run ``pytest tests/test_k8s.py tests/test_paddlejob.py``.

A CRD's ``openAPIV3Schema`` is a Kubernetes *structural* schema. :func:`json_schema` turns it
into the JSON Schema the API server effectively enforces with ``kubectl apply
--validate=strict``:

* an object with no ``x-kubernetes-preserve-unknown-fields`` and no ``additionalProperties``
  accepts only its ``properties``: an unknown field is an error (the API server would prune
  it, and strict field validation reports it);
* ``x-kubernetes-int-or-string`` accepts an integer or a string; ``nullable`` accepts null;
  ``format: int32``/``int64`` become bounds;
* the root's ``metadata`` (the CRD says only ``type: object``) is the Kubernetes ObjectMeta,
  as strict as the built-in kinds' (``$defs`` given by the caller);
* descriptions, defaults and the list/map markers are dropped; CEL rules
  (``x-kubernetes-validations``) compare an update with the previous object (``self ==
  oldSelf``) and cannot apply to a manifest before it exists: they are dropped too.

Katib's Experiment CRD keeps every field (``x-kubernetes-preserve-unknown-fields`` on the whole
object): its strictness lives in Go. Its ``SOURCES.json`` row is joined by the row of Katib's
OpenAPI document, marked ``"openapi_for": "kubeflow.org/v1beta1/Experiment"`` (not a CRD:
:func:`kinds` skips it); :func:`schema` then builds that kind's schema from the document with
:func:`openapi_schema`: the same rules (``$ref`` to ``#/$defs/katib.<name>``; an object with
``properties`` and no ``additionalProperties`` accepts only them; an object without
``properties`` stays open, e.g. the trial template's ``Unstructured`` trialSpec).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError

CRD_DIR = Path(__file__).resolve().parent / "crds"
SOURCES_FILE = CRD_DIR / "SOURCES.json"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

_BOUNDS = {
    "int32": {"minimum": -(2**31), "maximum": 2**31 - 1},
    "int64": {"minimum": -(2**63), "maximum": 2**63 - 1},
}
# structural-schema keys JSON Schema does not know, or that do not constrain a new object
_DROPPED = frozenset({"description", "default", "example", "externalDocs"})
OPENAPI_MARK = "openapi_for"  # SOURCES.json: the row of an OpenAPI document, "group/version/kind"
OPENAPI_REF = "#/components/schemas/"
OPENAPI_PREFIX = "katib."  # its definitions' names in $defs (apart from the Kubernetes ones)


@functools.cache
def sources() -> tuple[dict[str, str], ...]:
    """The rows of ``SOURCES.json``: file, repository, ref, commit, path, sha256."""
    return tuple(json.loads(SOURCES_FILE.read_text()))


def _verified(file: str) -> bytes:
    """The bytes of a vendored file whose sha256 is its ``SOURCES.json`` row's."""
    row = next((r for r in sources() if r["file"] == file), None)
    path = CRD_DIR / file
    if row is None:
        raise StepError(f"{SOURCES_FILE}: no row for {file}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != row["sha256"]:
        raise StepError(
            f"{path}: sha256 {digest} is not the vendored {row['sha256']} "
            f"({row['repository']} {row['ref']} {row['path']}): restore the upstream file"
        )
    return data


@functools.cache
def _crd(file: str) -> dict[str, Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(_verified(file), Loader=loader)


@functools.cache
def _openapi(file: str) -> dict[str, Any]:
    return json.loads(_verified(file))


@functools.cache
def kinds() -> dict[tuple[str, str], tuple[str, str]]:
    """``(group, kind) -> (file, version)`` of every vendored CRD: its served storage version."""
    out = {}
    for row in sources():
        if OPENAPI_MARK in row:  # a kind's strict schema, not a CRD
            continue
        crd = _crd(row["file"])
        spec = crd["spec"]
        storage = next(v["name"] for v in spec["versions"] if v.get("storage") and v.get("served"))
        out[(spec["group"], spec["names"]["kind"])] = (row["file"], storage)
    return out


def json_schema(node: Any, *, root: bool = False) -> Any:
    """The strict JSON Schema of a structural schema node (see the module's docstring)."""
    if isinstance(node, list):
        return [json_schema(n) for n in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: json_schema(sub) for name, sub in value.items()}
        elif key == "additionalProperties" and isinstance(value, Mapping):
            out[key] = json_schema(value)
        elif key == "format" and value in _BOUNDS:
            out.update(_BOUNDS[value])
        elif key in ("items", "not") or key in ("anyOf", "allOf", "oneOf"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    is_object = node.get("type") == "object"
    if (
        is_object
        and not node.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in node
    ):
        out["additionalProperties"] = False
    if root:  # every object has these, whether its CRD lists them or not (policy-controller's)
        props = out.setdefault("properties", {})
        props["metadata"] = {"$ref": f"#/$defs/{OBJECT_META}"}
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
    return out


def _openapi_node(node: Any) -> Any:
    """One node of an OpenAPI 3.0 schema as a structural-schema node for :func:`json_schema`:
    ``$ref`` renamed, an object without ``properties`` kept open."""
    if isinstance(node, list):
        return [_openapi_node(n) for n in node]
    if not isinstance(node, Mapping):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith(OPENAPI_REF):
            out[key] = "#/$defs/" + OPENAPI_PREFIX + value[len(OPENAPI_REF) :]
        elif key == "properties":
            out[key] = {name: _openapi_node(sub) for name, sub in value.items()}
        else:
            out[key] = _openapi_node(value)
    if out.get("type") == "object" and "properties" not in out:
        out.setdefault("additionalProperties", True)
    return out


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(OPENAPI_REF):
                yield value[len(OPENAPI_REF) :]
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _closure(defs: Mapping[str, Any], root: str) -> list[str]:
    """``root`` and every definition it refers to, directly or not."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += _refs(defs[name])
    return sorted(seen)


def openapi_schema(file: str, definition: str) -> dict[str, Any]:
    """The strict JSON Schema of ``definition`` in the vendored OpenAPI 3.0 document ``file``
    (module docstring): its definitions under ``$defs`` (``katib.<name>``), its ``metadata``
    the Kubernetes ObjectMeta ``#/$defs/<ObjectMeta>`` (the caller adds those ``$defs``)."""
    defs = _openapi(file)["components"]["schemas"]
    out = json_schema(_openapi_node(defs[definition]), root=True)
    out["$defs"] = {
        OPENAPI_PREFIX + name: json_schema(_openapi_node(defs[name]))
        for name in _closure(defs, definition)
    }
    return out


def _openapi_row(group: str, version: str, kind: str) -> dict[str, str] | None:
    return next((r for r in sources() if r.get(OPENAPI_MARK) == f"{group}/{version}/{kind}"), None)


@functools.cache
def schema(group: str, kind: str) -> dict[str, Any]:
    """The strict JSON Schema of ``kind``'s vendored CRD (its served storage version); its
    ``metadata`` refers to ``#/$defs/<ObjectMeta>``: the caller adds the Kubernetes ``$defs``.
    A kind with an OpenAPI row (Katib's Experiment) has that document's schema, whose own
    definitions are in its ``$defs``."""
    file, version = kinds()[(group, kind)]
    row = _openapi_row(group, version, kind)
    if row is not None:
        return openapi_schema(row["file"], f"{version}.{kind}")
    crd_version = next(v for v in _crd(file)["spec"]["versions"] if v["name"] == version)
    return json_schema(crd_version["schema"]["openAPIV3Schema"], root=True)
