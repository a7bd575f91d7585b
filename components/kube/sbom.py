"""CycloneDX SBOMs of the container images, read from the images themselves.

An image's SBOM (CycloneDX 1.6 JSON) lists:

- the Debian packages of its base: ``dpkg-query`` run in the image (``--network none``), one
  ``pkg:deb/debian/NAME@VERSION?arch=ARCH`` component each;
- its Python environment, where it has one: ``cyclonedx-py environment`` (cyclonedx-bom) run
  on the image's own interpreter, in the image; its components are merged in;
- what the caller adds: the serving image's OpenVINO runtime, the C++ server, the model
  bundle (a ``machine-learning-model`` component with the bundle's sha256).

``serving_image`` writes the serving image's SBOM next to its report (``sbom.cdx.json``);
``promote`` attaches it to the pushed image (``sha256-<hex>.sbom``) and keeps it with the
registered version; ``containers/images.py build`` writes the component and server images'
SBOMs under ``build/sbom/``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, combined_sha256, sha256_tree
from components.kube.images import _run

log = logging.getLogger(__name__)

SPEC = "1.6"
DPKG_FORMAT = "${Package}\\t${Version}\\t${Architecture}\\n"


def _in_image(builder: str, ref: str, entrypoint: str, *args: str) -> str:
    proc = _run(
        [builder, "run", "--rm", "--network", "none", "--user", "0", "--entrypoint", entrypoint,
         ref, *args],
        timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise StepError(f"SBOM of {ref}: {entrypoint} failed: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def debian_packages(builder: str, ref: str) -> list[dict[str, Any]]:
    """The installed Debian packages of ``ref`` as CycloneDX components."""
    rows = _in_image(builder, ref, "dpkg-query", "-W", "-f", DPKG_FORMAT.replace("\\t", "\t"))
    out = []
    for line in rows.splitlines():
        name, version, arch = (line.split("\t") + ["", ""])[:3]
        if not name:
            continue
        purl = f"pkg:deb/debian/{name}@{version}?arch={arch}"
        out.append(
            {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        )
    return out


def python_packages(builder: str, ref: str, python: str) -> list[dict[str, Any]]:
    """The Python environment of ``python`` in ``ref`` (cyclonedx-bom, run in the image)."""
    text = _in_image(
        builder, ref, python, "-m", "cyclonedx_py", "environment", "--of", "JSON",
        "--sv", SPEC, "--output-reproducible", python,
    )  # fmt: skip
    try:
        return list(json.loads(text).get("components", []))
    except ValueError as exc:
        raise StepError(f"SBOM of {ref}: cyclonedx-py wrote no JSON ({exc})") from None


def image_sbom(
    builder: str,
    ref: str,
    *,
    python: str | None = None,
    extra: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The CycloneDX document of image ``ref`` (module docstring)."""
    components = [*debian_packages(builder, ref)]
    if python:
        components += python_packages(builder, ref, python)
    components += list(extra)
    seen, unique = set(), []
    for component in components:  # one bom-ref once (the schema requires it)
        key = component.get("bom-ref") or f"{component['name']}@{component.get('version')}"
        if key not in seen:
            seen.add(key)
            unique.append({**component, "bom-ref": key})
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC,
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "paddle-mlops sbom"}]},
            "component": {"type": "container", "bom-ref": ref, "name": ref},
        },
        "components": unique,
    }


def validate(document: dict[str, Any]) -> None:
    """Refuse a document that is not valid CycloneDX 1.6 (cyclonedx-python-lib's schema)."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document))
    if error is not None:
        raise StepError(f"SBOM is not valid CycloneDX {SPEC}: {str(error)[:400]}")


def serving_image_sbom(builder: str, ref: str, bundle: Path, model: str) -> dict[str, Any]:
    """The serving image's SBOM: its Debian packages, the OpenVINO runtime and the C++
    server it carries, and the model ``bundle`` (its ``bundle_sha256``)."""
    from importlib.metadata import PackageNotFoundError, version

    labels = _run([builder, "image", "inspect", "--format", "{{json .Config.Labels}}", ref])
    revision = (json.loads(labels.stdout or "{}") or {}).get("org.opencontainers.image.revision")
    libs = _in_image(builder, ref, "/bin/sh", "-c", "ls /opt/openvino/libs 2>/dev/null || true")
    sonames = sorted(n for n in libs.split() if n.startswith("libopenvino.so."))
    # the registry's bundle_sha256 (components.tracking.model), without importing MLflow here
    bundle_digest = combined_sha256(sha256_tree(bundle))
    try:
        openvino = version("openvino")
    except PackageNotFoundError:
        openvino = "unknown"
    extra = [
        {
            "type": "application",
            "bom-ref": "paddle-mlops-server",
            "name": "paddle-mlops-server",
            "version": revision or "unknown",
            "description": "the C++ KServe v2 server (serving/src)",
        },
        {
            "type": "framework",
            "bom-ref": f"pkg:pypi/openvino@{openvino}",
            "name": "openvino",
            "version": openvino,
            "purl": f"pkg:pypi/openvino@{openvino}",
            "description": "OpenVINO runtime libraries under /opt/openvino/libs",
            "properties": [{"name": "paddle-mlops:soname", "value": s} for s in sonames],
        },
        {
            "type": "machine-learning-model",
            "bom-ref": f"model:{model}",
            "name": model,
            "description": "the serving bundle under /mnt/models",
            "properties": [{"name": "paddle-mlops:bundle_sha256", "value": bundle_digest}],
        },
    ]
    return image_sbom(builder, ref, extra=extra)
