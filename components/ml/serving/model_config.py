"""The bundle's model config: ``model_config.json`` beside ``signature.json``.

The per-model settings the C++ server runs a version with (workers, threads, batching, queue,
timeout), like Triton's per-model ``config.pbtxt``. One source, one copy:

``params.yaml: package.model_config`` → ``package`` writes it into the bundle → infra
validation (``serving_image``), the image (the bundle is its ``/mnt/models``) and ``deploy``
(``fetch-model`` or KServe's storage initializer put the registered bundle in
``/mnt/models``) all serve that bundle, and the server reads the file itself. A flag or a
``SERVING_*`` variable on the server only overrides it (``serving/src/config.h``); the
server's ``GET /v2/models/<name>/config`` answers what a version really runs with.

The file's rules (keys, types, defaults, bounds) are written once, in its JSON Schema
:data:`SCHEMA_FILE`: :func:`read` validates a bundle's file against it, and the C++ server's
defaults and minimums are generated from it when it is built (``serving/CMakeLists.txt``);
``tests/test_model_config_schema.py`` drives the built server with values made from it.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Annotated, Any

import jsonschema
from pydantic import Field

from components.core.artifacts import StepError, read_json, write_json
from components.core.config import params_model

MODEL_CONFIG_FILE = "model_config.json"  # kModelConfigFile in serving/src/config.h
SCHEMA_FILE = Path(__file__).with_suffix("") / "model_config.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
SETTINGS: dict[str, dict[str, Any]] = SCHEMA["properties"]  # every key the server reads
DEFAULTS: dict[str, Any] = {k: p["default"] for k, p in SETTINGS.items()}  # the server's own

# The smallest value the server accepts for each integer setting (the schema's minimum):
# 0 threads per worker is the runtime's default, a 0 queue delay runs what is queued at once,
# a 0 queue size is unbounded.
MINIMUMS = {k: p["minimum"] for k, p in SETTINGS.items() if p["type"] == "integer"}
TYPE_NAMES = {"integer": "int", "boolean": "bool", "number": "float", "string": "str"}


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    """The schema's validator; an integer is a JSON integer (``1.0`` is not, as in C++)."""
    base = jsonschema.Draft202012Validator
    base.check_schema(SCHEMA)
    integer = base.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(base, type_checker=integer)(SCHEMA)


def _rule(error: jsonschema.ValidationError, doc: dict[str, Any]) -> tuple[int, str, str]:
    """(order, field, rule) of one way ``doc`` breaks the schema: an unknown key or a wrong
    type first, then missing keys, then values out of bounds."""
    if error.validator == "additionalProperties":
        key = next(k for k in doc if k not in SETTINGS)
        return 0, key, f"not a per-model setting ({sorted(SETTINGS)})"
    if error.validator == "required":
        return 1, "", f"missing field(s) {sorted(set(SCHEMA['required']) - set(doc))}"
    key = str(error.path[0])
    spec, value = SETTINGS[key], doc[key]
    if error.validator == "type":
        return 0, key, f"must be {TYPE_NAMES[spec['type']]}, got {value!r}"
    if error.validator == "enum":
        return 0, key, f"must be one of {spec['enum']}, got {value!r}"
    if spec["type"] == "number" and {"minimum", "maximum"} <= spec.keys():
        return 2, key, f"must be in [{spec['minimum']}, {spec['maximum']}], got {value}"
    if error.validator == "minimum":
        return 2, key, f"must be >= {spec['minimum']}, got {value}"
    return 2, key, f"must be <= {spec['maximum']}, got {value}"


def violation(doc: dict[str, Any]) -> tuple[str, str] | None:
    """The first way ``doc`` (a model_config.json) breaks :data:`SCHEMA`, as (field, rule)
    (field ``""``: the document), in the order an unknown key, a wrong type, a missing key,
    a value out of bounds; None: valid."""
    keys = list(doc)
    found = sorted(
        (_rule(e, doc) for e in _validator().iter_errors(doc)),
        key=lambda r: (r[0], keys.index(r[1]) if r[1] in keys else -1),
    )
    return (found[0][1], found[0][2]) if found else None


def _bounded(key: str) -> Any:
    """The type of setting ``key`` with the schema's bounds as pydantic constraints, so the
    params JSON Schema (``paddle-mlops params schema``) shows editors the same bounds."""
    spec = SETTINGS[key]
    kind = {"integer": int, "number": float}[spec["type"]]
    bounds = {"ge": spec.get("minimum"), "le": spec.get("maximum")}
    return Annotated[kind, Field(**{k: v for k, v in bounds.items() if v is not None})]


Workers = _bounded("workers")
ThreadsPerWorker = _bounded("threads_per_worker")
MaxBatchSize = _bounded("max_batch_size")
MaxQueueDelayUs = _bounded("max_queue_delay_us")
MaxQueueSize = _bounded("max_queue_size")
RequestTimeoutMs = _bounded("request_timeout_ms")
LogInputRate = _bounded("log_input_rate")


@params_model
class ModelConfig:
    """Every field is required (the schema's ``required``): ``params.yaml`` is the one place
    their values are written (the schema's defaults, the C++ server's, only serve a bundle
    without the file or a key)."""

    # the fields' types carry the schema's bounds (_bounded), so pydantic checks them; a
    # bundle's file is checked against the schema itself (read)
    workers: Workers
    threads_per_worker: ThreadsPerWorker
    max_batch_size: MaxBatchSize
    max_queue_delay_us: MaxQueueDelayUs
    dynamic_batching: bool
    max_queue_size: MaxQueueSize
    request_timeout_ms: RequestTimeoutMs
    # the share of requests whose inputs the prediction log keeps (outputs: always), when
    # the server runs with a log directory (serving/src/prediction_log.h)
    log_input_rate: LogInputRate

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write(bundle_dir: str | Path, config: ModelConfig) -> Path:
    """``bundle_dir/model_config.json`` (atomically)."""
    path = Path(bundle_dir) / MODEL_CONFIG_FILE
    write_json(path, config.to_json())
    return path


def read(bundle_dir: str | Path) -> ModelConfig:
    """The model config of a bundle ``package`` wrote; a missing file or a field that breaks
    :data:`SCHEMA` (not a per-model setting, a wrong type, out of bounds) is an error naming
    the file and the field."""
    path = Path(bundle_dir) / MODEL_CONFIG_FILE
    if not path.is_file():
        raise StepError(f"{path}: missing; the bundle must come from package")
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise StepError(f"{path}: top level must be an object of settings")
    broken = violation(doc)
    if broken is not None:
        field, rule = broken
        raise StepError(f"{path}: field '{field}': {rule}" if field else f"{path}: {rule}")
    # the settings package writes; the optional ones (precision, cpu_pinning) the server reads
    written = {f.name: doc[f.name] for f in fields(ModelConfig)}
    return ModelConfig(**{**written, "log_input_rate": float(doc["log_input_rate"])})
