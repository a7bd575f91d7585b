"""The served bundle as a real MLflow model: a ``pyfunc`` that runs it with Paddle Inference.

Library layer: imported (lazily) by track, register and the registry; imports no step.

What is logged (:func:`log_bundle_model`, inside the active run, as an MLflow 3 LoggedModel)::

    MLmodel                      flavor python_function, signature, model_config, metadata
    python_model.pkl             a PaddleBundleModel instance without state (class by reference)
    input_example.json           the first images of the data set's split ``test``, as stored
                                 (only the row group they are in is read)
    serving_input_example.json   the same, as a POST /invocations body
    artifacts/bundle/            the serving bundle of ``package``, byte for byte: fp32 PIR +
                                 legacy programs, int8/paddle, int8/openvino, signature.json,
                                 parity.json, manifest.json (:func:`bundle_dir`)
    requirements.txt, python_env.yaml, conda.yaml

The bundle's sha256 (:func:`bundle_sha256`, over every file) is the run tag, the logged
model's tag and the registered version's tag :data:`BUNDLE_TAG`; the blessing re-hashes the
downloaded bundle against it.

Inference (:class:`PaddleBundleModel`) is the same code as ``evaluate``: the task's own
preprocessing (``components.tasks``, built from ``model_config``) then the bundle's fp32
program in :class:`components.ml.serving.runtime.PaddlePredictor` (``ModelFiles.in_dir``: the PIR
``model.json``), as :func:`components.tasks.scoring.score_model` does.

Input (signature: one unnamed tensor ``uint8 [-1, H, W, C]``, the stored layout of
``docs/data-format.md``; ``H, W, C`` are the data set's, e.g. ``[-1, 8, 8, 1]`` for the
builtin digits): raw images, values 0-255, as the snapshot's shards store them (``image``
bytes with ``height``, ``width``, ``channels``).

- a NumPy array ``uint8 [N, H, W, C]``;
- a pandas DataFrame with ONE column (any name), one row per image, each cell a flat list
  (or array) of the ``H*W*C`` pixel values in row-major ``H, W, C`` order. MLflow's schema
  enforcement turns it into the array above before ``predict`` sees it (it casts to uint8, so
  send values within 0-255). Called directly (``unwrap_python_model()``, no schema
  enforcement), ``predict`` also takes a DataFrame of ``H*W*C`` numeric columns, one row per
  image, and ``[N, H, W]`` arrays when ``C == 1``.
- over HTTP (``mlflow models serve``): ``{"inputs": [[[[p, ...]]], ...]}`` (nested
  ``[N][H][W][C]``) or ``{"dataframe_split": {"columns": ["image"], "data": [[[p, ...]]]}}``.

Output: a dict of arrays, one row per image (the served JSON is
``{"predictions": {"predicted": [...], "probabilities": [[...]], "logits": [[...]]}}``):

- ``predicted``: int64 ``[N]``, the class id (``argmax`` of the logits); its name is
  ``metadata.label_names[id]`` in MLmodel (and ``label_names`` in the bundle's signature.json);
- ``probabilities``: float32 ``[N, K]``, softmax of the logits;
- ``logits``: float32 ``[N, K]``, the model's output as the bundle's fp32 program returns it.

How the class is found when the model is loaded: **importable class**. ``python_model.pkl``
holds an instance of :class:`PaddleBundleModel` with no state (cloudpickle stores a class of an
importable module by reference: ``components.tracking.model.PaddleBundleModel``); everything it
needs is in the model directory (``artifacts/bundle``, ``model_config``) and is read in
``load_context``. So any process where ``components`` is importable loads it: this venv (the
project is installed), the component image (``PYTHONPATH=/opt/paddle-mlops``),
``mlflow models serve --env-manager local``. Rejected:

- ``code_paths=["components"]``: a second copy of the package inside every model, put first
  on ``sys.path`` at load time (MLflow 3.17 only prepends it): in a process that already
  imported ``components`` (every step, the registry CLI) the copy is silently ignored, in a
  fresh one it shadows the installed package, so which code runs depends on import order.
  It still needs Paddle, OpenCV etc. installed: no self-containment gained.
- models-from-code (``python_model="file.py"``): the file would be executed at load and
  still import ``components`` for the runtime and the task preprocessing (not duplicating
  them is the point); it adds a script to keep in sync for nothing an importable class lacks.
  (It would avoid MLflow's warning about cloudpickle; but unpickling a class reference runs
  no code beyond importing ``components``, the same trust as models-from-code.)

The price of an importable class: the loading environment needs a compatible ``components``
(the package is not on PyPI, so ``requirements.txt`` lists Paddle, MLflow, NumPy, pandas,
OpenCV... pinned to the logging environment, but not the package itself; ``--env-manager
virtualenv/conda`` cannot rebuild it). Its interface here is small and stable: the class
name, ``model_config`` keys and :func:`bundle_dir`'s layout.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow.pyfunc  # noqa: E402  (after the telemetry default)
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE  # noqa: E402

from components.core.artifacts import StepError, combined_sha256, read_json, sha256_tree  # noqa: E402

log = logging.getLogger(__name__)

BUNDLE_TAG = "bundle_sha256"  # run tag, logged-model tag and model-version tag
BUNDLE_ARTIFACT = "bundle"  # the pyfunc artifact key: <model root>/artifacts/bundle
MODEL_NAME = "model"  # the LoggedModel's name in the run
# distributions whose versions are pinned into the model's requirements.txt (if installed)
_REQUIREMENTS = (
    "mlflow",
    "paddlepaddle",
    "paddlepaddle-gpu",
    "numpy",
    "pandas",
    "opencv-python-headless",
    "pillow",
    "tqdm",
    "pyyaml",
    # the text tasks' tokenizer, and the pins paddlenlp 2.8.1 imports with (docs/sentiment.md)
    "paddlenlp",
    "datasets",
    "huggingface_hub",
    "aistudio-sdk",
)
_EXAMPLE_BYTES = 64 * 1024  # input_example.json stays small: at most this many pixel bytes


# --------------------------------------------------------------------------- layout


def bundle_dir(model_root: Path) -> Path:
    """The serving bundle inside a downloaded MLflow model directory (``artifacts/bundle``)."""
    model_root = Path(model_root)
    bundle = model_root / "artifacts" / BUNDLE_ARTIFACT
    if (bundle / "signature.json").is_file():
        return bundle
    if not (model_root / "MLmodel").is_file():
        raise StepError(
            f"{model_root}: not an MLflow model (no MLmodel file); expected the model logged "
            f"by track, with the serving bundle under artifacts/{BUNDLE_ARTIFACT}/"
        )
    raise StepError(
        f"{model_root}: MLflow model without a serving bundle: "
        f"artifacts/{BUNDLE_ARTIFACT}/signature.json not found (log it with "
        "components.tracking.model.log_bundle_model)"
    )


def bundle_sha256(bundle: Path) -> str:
    """One sha256 over every file of the bundle (relative path + content)."""
    return combined_sha256(sha256_tree(bundle))


SERVED_TAG = "served_sha256"  # run tag and model-version tag: what the model computes
# Bundle files whose bytes record the process that wrote them, not the model: the manifests
# (time, paths, machine), the legacy programs (each op's Python call stack, with the temporary
# directory of the process) and OpenVINO IR XML (node names from a per-process counter).
# Measured: two fresh processes exporting the same weights differ only in these.
_PROCESS_BOUND = ("manifest.json", ".pdmodel", ".xml")


def served_sha256(bundle: Path) -> str:
    """One sha256 over the bundle files that are a function of the model alone: weights (fp32
    and int8), the PIR program, the signature and parity report. Equal for the same model
    exported again by another process, where :func:`bundle_sha256` is not."""
    files = sha256_tree(bundle)
    return combined_sha256({k: v for k, v in files.items() if not k.endswith(_PROCESS_BOUND)})


# --------------------------------------------------------------------------- inference


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)


def _invalid(message: str) -> MlflowException:
    """A bad request (HTTP 400 from ``mlflow models serve``), not a server error."""
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


class PaddleBundleModel(mlflow.pyfunc.PythonModel):
    """The bundle's fp32 program in Paddle Inference behind the task's preprocessing.

    Holds no state until :meth:`load_context` (the pickled instance is only a class
    reference). ``model_config`` keys: ``task`` (name), ``task_options``, ``input_shape``
    (``[H, W, C]`` of a stored image), ``threads`` (Paddle CPU threads, default 1) and
    ``batch_size`` (default 256); ``mlflow.pyfunc.load_model(uri, model_config={...})``
    overrides them (e.g. ``threads``).
    """

    def load_context(self, context: Any) -> None:
        self.setup(Path(context.artifacts[BUNDLE_ARTIFACT]), dict(context.model_config or {}))

    def setup(self, bundle: Path, config: Mapping[str, Any]) -> None:
        """Load the bundle (what ``load_context`` does, without an MLflow context)."""
        # paddle (runtime) and the task load only when a model is loaded: track and register
        # import this module for its tags and logging, and must not pay for them
        from components.ml.serving.runtime import ModelFiles, PaddlePredictor
        from components.tasks import get_task

        missing = [k for k in ("task", "input_shape") if k not in config]
        if missing:
            raise StepError(f"MLmodel model_config: field(s) {missing} missing")
        self.task = get_task(
            str(config["task"]), dict(config.get("task_options") or {}), source="MLmodel"
        )
        self.task.load_assets(bundle)
        self.input_shape = [int(x) for x in config["input_shape"]]
        self.batch_size = int(config.get("batch_size", 256))
        self.predictor = PaddlePredictor(
            ModelFiles.in_dir(bundle), threads=int(config.get("threads", 1))
        )
        self.label_names = list(read_json(bundle / "signature.json").get("label_names") or [])
        # one Paddle predictor is not thread-safe; the scoring server runs requests in threads
        self._lock = threading.Lock()

    def predict(
        self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None
    ) -> dict[str, np.ndarray]:
        """Class scores of raw images (module doc): ``predicted``, ``probabilities``,
        ``logits``. ``model_input`` arrives as an array once MLflow enforced the signature;
        called directly it may also be a DataFrame."""
        try:
            inputs = self.task.pyfunc_inputs(model_input, self.input_shape)
        except ValueError as exc:
            raise _invalid(str(exc)) from exc
        with self._lock:
            logits = self.predictor.predict(inputs, self.batch_size)
        logits = np.asarray(logits, dtype=np.float32)
        if not self.task.outputs_logits:  # a generator: its output as the signature names it
            return {self.task.output_specs(len(self.label_names))[0].name: logits}
        return {
            "predicted": logits.argmax(axis=1).astype(np.int64),
            "probabilities": _softmax(logits),
            "logits": logits,
        }


# --------------------------------------------------------------------------- logging


@dataclass(frozen=True)
class LoggedBundle:
    """What :func:`log_bundle_model` logged: ``model_uri`` is ``models:/<model_id>``."""

    model_id: str
    model_uri: str
    run_id: str
    bundle_sha256: str
    info: Any  # mlflow.models.model.ModelInfo


def _requirements() -> list[str]:
    from importlib import metadata

    out = []
    for dist in _REQUIREMENTS:
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return out


def _examples(task: Any, data_dir: Path, split: str, count: int) -> tuple[Any, list[int]]:
    where = f"{data_dir}: split {split}"
    try:
        return task.pyfunc_examples(data_dir, split, count, _EXAMPLE_BYTES)
    except ValueError as exc:
        raise StepError(f"{where}: {exc} (docs/data-format.md)") from exc


def log_bundle_model(
    bundle: str | Path,
    data_dir: str | Path,
    task_name: str,
    task_options: Mapping[str, Any] | None = None,
    *,
    name: str = MODEL_NAME,
    split: str = "test",
    examples: int = 2,
    threads: int = 1,
    source: str = "params.yaml",
) -> LoggedBundle:
    """Log ``bundle`` as a pyfunc MLflow model in the active run (see the module doc).

    The signature and the input example come from ``examples`` real images of ``data_dir``'s
    ``split`` (the stored layout, e.g. ``uint8 [-1, 8, 8, 1]``) and the model's own output on
    them. ``task_name``/``task_options`` are ``params.yaml: task`` (errors name ``source``).
    """
    from components.tasks import get_task

    bundle, data_dir = Path(bundle), Path(data_dir)
    sig_file = bundle / "signature.json"
    if not sig_file.is_file():
        raise StepError(f"{sig_file}: missing; the bundle must be the output of package/export")
    signature_json = read_json(sig_file)
    task = get_task(task_name, dict(task_options or {}), source=source)
    if signature_json.get("task") != task.name:
        raise StepError(
            f"{sig_file}: field 'task' is '{signature_json.get('task')}' but {source}: "
            f"task.name is '{task.name}'; the bundle was exported for another task"
        )
    active = mlflow.active_run()
    if active is None:
        raise StepError("log_bundle_model: no active MLflow run (call it inside start_run)")
    sha = bundle_sha256(bundle)
    images, shape = _examples(task, data_dir, split, examples)
    config = {
        "task": task.name,
        "task_options": dict(task_options or {}),
        "input_shape": list(shape),
        "threads": threads,
        "batch_size": 256,
    }
    info = _log_pyfunc(bundle, sha, task.name, signature_json, images, config, name)
    saved = info.flavors["python_function"]["artifacts"][BUNDLE_ARTIFACT]["path"]
    if saved != f"artifacts/{BUNDLE_ARTIFACT}":
        raise StepError(
            f"MLflow stored the bundle at '{saved}', not artifacts/{BUNDLE_ARTIFACT} "
            "(components.tracking.model.bundle_dir expects the latter)"
        )
    log.info(
        "logged MLflow model %s (%s, bundle sha256 %s, input uint8 %s)",
        info.model_id,
        info.model_uri,
        sha[:12],
        [-1, *shape],
    )
    return LoggedBundle(info.model_id, info.model_uri, active.info.run_id, sha, info)


def _log_pyfunc(
    bundle: Path,
    sha: str,
    task_name: str,
    signature_json: Mapping[str, Any],
    images: Any,
    config: dict[str, Any],
    name: str,
) -> Any:
    """Log a staged copy of ``bundle`` (checked to still hash to ``sha``) as the pyfunc model
    ``name``, its signature inferred from the model's own output on ``images``; returns
    MLflow's ModelInfo."""
    from mlflow.models import infer_signature

    with tempfile.TemporaryDirectory(prefix="bundle-model-") as tmp:
        # the pyfunc artifact's directory name is its path in the model: artifacts/bundle
        staged = Path(tmp) / BUNDLE_ARTIFACT
        shutil.copytree(bundle, staged)
        if bundle_sha256(staged) != sha:
            raise StepError(f"{bundle}: changed while it was being logged (sha256 differs)")
        probe = PaddleBundleModel()
        probe.setup(staged, config)
        outputs = probe.predict(None, images)
        signature = infer_signature(images, outputs)
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=PaddleBundleModel(),
            artifacts={BUNDLE_ARTIFACT: str(staged)},
            model_config=config,
            signature=signature,
            input_example=images,
            pip_requirements=_requirements(),
            metadata={
                "task": task_name,
                "label_names": list(signature_json.get("label_names") or []),
                "formats": sorted(signature_json.get("formats") or {}),
                BUNDLE_TAG: sha,
            },
            tags={BUNDLE_TAG: sha, "task": task_name},
        )
    return info
