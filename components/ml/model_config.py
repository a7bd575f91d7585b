"""The bundle's model config: ``model_config.json`` beside ``signature.json``.

The per-model settings the C++ server runs a version with (workers, threads, batching, queue,
timeout), like Triton's per-model ``config.pbtxt``. One source, one copy:

``params.yaml: package.model_config`` → ``package`` writes it into the bundle → infra
validation (``serving_image``), the image (the bundle is its ``/mnt/models``) and ``deploy``
(``fetch-model`` or KServe's storage initializer put the registered bundle in
``/mnt/models``) all serve that bundle, and the server reads the file itself. A flag or a
``SERVING_*`` variable on the server only overrides it (``serving/src/config.h``); the
server's ``GET /v2/models/<name>/config`` answers what a version really runs with.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import typing
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError

from components.core.artifacts import StepError, read_json, write_json
from components.core.config import params_model, rule_of

MODEL_CONFIG_FILE = "model_config.json"  # kModelConfigFile in serving/src/config.h

# The smallest value the server accepts for each integer setting (serving/src/config.cc):
# 0 threads per worker is the runtime's default, a 0 queue delay runs what is queued at once,
# a 0 queue size is unbounded.
AtLeast0 = Annotated[int, Field(ge=0)]
AtLeast1 = Annotated[int, Field(ge=1)]


@params_model
class ModelConfig:
    """Every field is required: ``params.yaml`` is the one place their values are written
    (the C++ defaults in ``serving/src/defaults.h`` only serve a bundle without the file)."""

    workers: AtLeast1
    threads_per_worker: AtLeast0
    max_batch_size: AtLeast1
    max_queue_delay_us: AtLeast0
    dynamic_batching: bool
    max_queue_size: AtLeast0
    request_timeout_ms: AtLeast1
    # the share of requests whose inputs the prediction log keeps (outputs: always), when
    # the server runs with a log directory (serving/src/prediction_log.h)
    log_input_rate: Annotated[float, Field(ge=0, le=1)]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write(bundle_dir: str | Path, config: ModelConfig) -> Path:
    """``bundle_dir/model_config.json`` (atomically)."""
    path = Path(bundle_dir) / MODEL_CONFIG_FILE
    write_json(path, config.to_json())
    return path


def read(bundle_dir: str | Path) -> ModelConfig:
    """The model config of a bundle ``package`` wrote; a missing file or a field that is not
    a per-model setting is an error naming the file and the field."""
    path = Path(bundle_dir) / MODEL_CONFIG_FILE
    if not path.is_file():
        raise StepError(f"{path}: missing; the bundle must come from package")
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise StepError(f"{path}: top level must be an object of settings")
    known = typing.get_type_hints(ModelConfig)  # name -> type (its bounds stripped)
    for key, value in doc.items():
        if key not in known:
            raise StepError(f"{path}: field '{key}': not a per-model setting ({sorted(known)})")
        kind = known[key]
        want: tuple[type, ...] = (int,)
        if kind in ("bool", bool):
            want = (bool,)
        elif kind in ("float", float):
            want = (float, int)
        if type(value) not in want:
            raise StepError(f"{path}: field '{key}': must be {want[0].__name__}, got {value!r}")
    missing = sorted(set(known) - set(doc))
    if missing:
        raise StepError(f"{path}: missing field(s) {missing}")
    try:
        return ModelConfig(**{**doc, "log_input_rate": float(doc["log_input_rate"])})
    except ValidationError as exc:
        error = exc.errors()[0]
        raise StepError(f"{path}: field '{error['loc'][0]}': {rule_of(error)}") from None
