"""register: version the model in the MLflow registry as the challenger, and bless it.

1. Registers the MLflow model the tracked run logged (``run.json``: ``model_id``; a pyfunc
   whose ``artifacts/bundle`` is the packaged bundle: fp32 PIR + legacy, the gated int8
   model, signature, manifests; :mod:`components.tracking.model`) as a new version of
   ``registry.model_name`` (default ``<task>-classifier``). The version's source is
   ``models:/<model_id>`` (with ``model_id`` and ``run_id``; the tag ``mlflow_model_id`` too),
   its download URI the LoggedModel's artifact location, so ``models:/<name>/<version>``
   downloads (and ``mlflow.pyfunc.load_model`` loads) the MLflow model root: MLmodel + the
   bundle. It copies the lineage tags of the run onto the version
   (``git_sha``, ``data_sha256``, ``snapshot_sha256``, ``params_sha256``, ``ge_success``,
   ``qat_gate_passed``, the serving image and its infra validation, ``bundle_sha256``) plus
   key metrics, and points alias ``challenger`` at it. With the version's run it stores the
   split it is blessed on (``holdout/``: a mini snapshot, tag ``test_split_sha256``) and the
   keys of the samples it was made from (``training_keys/keys.npy``: train + val, tag
   ``training_keys_sha256``).
2. Blesses it: the registered challenger and, if one exists, the registered champion are both
   downloaded (each bundle re-hashed against its ``bundle_sha256`` tag) and scored by the same
   code as ``evaluate``, sample by sample, on the current test split and on the pinned holdout
   (docs/gates.md). Blessed means: lineage complete, accuracy at least
   ``register.min_accuracy``, no sample of the pinned holdout in the challenger's training
   snapshot (tag ``holdout_leak_check``), and no significant regression against the champion,
   which is scored only on samples outside its own training snapshot (tag
   ``champion_exclusions``; a champion without recorded keys, or fewer than
   ``register.min_clean_samples`` left, is not compared and the blessing refused).
   ``blessing.json`` records the decision, every reason, and both models' metrics.

Promotion (pushing the image, moving ``champion``) is the next step, ``promote``; the
registry's own commands (status, a manual or forced promotion, rollback) are
``paddle-mlops registry --help``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, read_json, write_json
from components.core.uris import redact_uri
from components.faults import failpoints
from components.kernel.step import DATA, In, Out, Step
from components.ml.decisions.blessing import Blessing, RegisterParams, bless
from components.tasks import Task
from components.tracking.champion import compare_with_champion, record_blessing
from components.tracking.model import BUNDLE_TAG
from components.tracking.registration import (
    logged_model,
    record_training_data,
    register_version,
    run_lineage,
    version_tags,
)
from components.tracking.registry import (
    CHALLENGER,
    LINEAGE_TAGS,
    SNAPSHOT_TAG,
    Registry,
    RegistryParams,
    model_name,
    set_alias,
    step_run,
)
from components.tracking.registry import client as mlflow_client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegisterResult:
    name: str
    version: int
    blessing: Blessing


def run(
    params: RegisterParams,
    task: Task,
    run_file: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    registry_params: RegistryParams | None = None,
    tracking_uri: str | None = None,
) -> RegisterResult:
    """Register the run ``run_file`` names (or ``run.json`` in that directory) as the
    ``challenger`` and bless it; promotion is the ``promote`` step's."""

    run_file, data_dir, out_dir = Path(run_file), Path(data_dir), Path(out_dir)
    run_file = run_file / "run.json" if run_file.is_dir() else run_file
    run_info = read_json(run_file)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or run_info["tracking_uri"]
    if uri == run_info["tracking_uri"] and "***" in uri:
        raise StepError(
            f"{run_file}: field 'tracking_uri' {uri} is redacted (it held credentials); set "
            "MLFLOW_TRACKING_URI (and MLFLOW_TRACKING_USERNAME/PASSWORD or TOKEN)"
        )
    client = mlflow_client(uri)
    registry_params = registry_params or RegistryParams()
    name = model_name(registry_params, task)
    registry = Registry(client, name, registry_params)
    mlrun = client.get_run(run_info["run_id"])
    run_id = mlrun.info.run_id
    with step_run(
        client,
        run_id,
        "register",
        {"registered_model": name},
        stale_after_s=registry_params.lock_stale_s,
    ) as step_id:
        result = _register(
            params,
            task,
            client,
            uri,
            registry,
            run_info,
            run_file,
            mlrun,
            data_dir,
            out_dir,
            step_id,
        )
        client.set_tag(step_id, "model_version", str(result.version))
        client.log_artifact(step_id, str(out_dir / "blessing.json"))
    return result


def _register(
    params: RegisterParams,
    task: Task,
    client: Any,
    uri: str,
    registry: Registry,
    run_info: dict[str, Any],
    run_file: Path,
    mlrun: Any,
    data_dir: Path,
    out_dir: Path,
    step_id: str,
) -> RegisterResult:
    """:func:`run`'s work inside register's own run ``step_id``."""
    name, run_id = registry.name, mlrun.info.run_id
    model = logged_model(client, run_info, run_file)
    lineage, trained_on_other_data = run_lineage(mlrun, model, data_dir)
    tags = version_tags(lineage, mlrun, task.name, model)
    description = f"pipeline run {run_id} ({lineage.get('git_sha')}), model {model.model_id}"
    version = register_version(
        client, uri, name, run_id, model, tags, description, registry.params.lock_stale_s
    )
    # the version's own run and model: another (dead) pipeline run's when it was adopted
    registered = client.get_model_version(name, str(version))
    failpoints.hit("register.after_version", f"{name} v{version}")
    set_alias(client, name, CHALLENGER, version, backoff=registry.params.alias_backoff)
    log.info(
        "registered %s v%d (alias %s) from model %s, bundle sha256 %s",
        name,
        version,
        CHALLENGER,
        model.model_id,
        (lineage[BUNDLE_TAG] or "none")[:12],
    )
    split_sha, training_keys = record_training_data(
        client, registered, data_dir, params.split, lineage[SNAPSHOT_TAG]
    )
    challenger, champion, paired, task_rules, integrity = compare_with_champion(
        client, uri, registry, version, params, task, data_dir, split_sha, training_keys
    )
    if trained_on_other_data:
        integrity.failures.insert(0, trained_on_other_data)
    if "test.baseline_accuracy" in mlrun.data.metrics:  # evaluate's, on the same split
        challenger["baseline_accuracy"] = float(mlrun.data.metrics["test.baseline_accuracy"])
        beats = challenger["accuracy"] > challenger["baseline_accuracy"]
        client.set_model_version_tag(name, str(version), "beats_baseline", str(beats).lower())
    blessing = bless(
        params,
        lineage,
        challenger,
        champion,
        paired,
        task_rules,
        outcome=task.outcome,
        integrity=integrity,
        required=LINEAGE_TAGS,
    )
    record_blessing(client, name, version, step_id, blessing)
    write_json(
        out_dir / "blessing.json",
        {"model": name, "version": version, **asdict(blessing), "params": asdict(params)},
    )
    _log_decision(name, version, task.outcome, blessing)
    _write_registration(
        out_dir, client, uri, registry, version, registered, model, blessing, run_id
    )
    return RegisterResult(name, version, blessing)


def _write_registration(
    out_dir: Path,
    client: Any,
    uri: str,
    registry: Registry,
    version: int,
    registered: Any,
    model: Any,
    blessing: Blessing,
    run_id: str,
) -> None:
    """``registration.json``: the version, its decision and where it came from (promote's input)."""
    name, champion = registry.name, blessing.champion
    write_json(
        out_dir / "registration.json",
        {
            "model": name,
            "version": version,
            "blessed": blessing.blessed,
            # the champion the blessing judged against: promote refuses if it moved since
            "judged_against": champion["version"] if champion else None,
            # the pipeline run register was given (promote nests its own run under it)
            "pipeline_run_id": run_id,
            "tracking_uri": redact_uri(uri),
            "model_id": registered.model_id or model.model_id,
            "version_run_id": registered.run_id,
            "source": redact_uri(client.get_model_version_download_uri(name, str(version))),
            "aliases": registry.aliases(),
        },
    )


def _log_decision(name: str, version: int, outcome: str, blessing: Blessing) -> None:
    """The blessing in the step's log: the scores when blessed, every reason when not."""
    challenger, champion = blessing.challenger, blessing.champion
    if blessing.blessed:
        log.info(
            "%s v%d blessed (%s %.4f%s)",
            name,
            version,
            outcome,
            challenger["accuracy"],
            f", champion v{champion['version']} {champion['accuracy']:.4f}"
            if champion
            else ", no champion yet",
        )
    else:
        log.warning(
            "%s v%d NOT blessed:\n%s",
            name,
            version,
            "\n".join(f"  - {r}" for r in blessing.reasons),
        )


STEP = Step(
    name="register",
    doc=__doc__,
    params=RegisterParams,
    sections=("task", "register", "registry"),
    shared=(("registry", "registry_params", RegistryParams),),
    run=run,
    inputs=(
        In("run_info", "outputs/track", "run_file", source="track.run_info", help="run.json"),
        DATA,
    ),
    outputs=(
        Out(
            "registration",
            "outputs/register",
            "out_dir",
            dvc="uncached",
            help="registration.json, blessing.json",
        ),
    ),
    result="blessing.blessed",
    result_type=bool,
)
