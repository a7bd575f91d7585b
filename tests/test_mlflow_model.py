"""The registered model version is a real MLflow model (components.tracking.model).

The real track and register steps run once (module fixture) on the packaged bundle of the
session fixtures, against a real ``mlflow server`` on loopback; then the version is loaded
by MLflow itself (``mlflow.pyfunc.load_model``, ``mlflow models serve``) and compared with
the bundle scored by the in-process Paddle runtime, as ``evaluate`` scores it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from components.core.artifacts import StepError, read_json, sha256_tree
from components.core.ports import free_port
from components.tracking.registry import LINEAGE_TAGS, Registry, RegistryParams, global_tracking_uri
from tests.conftest import BIN
from tests.test_registry import TASK_OPTIONS, server  # noqa: F401  (the module's server)

NAME = "mlflow-model-classifier"
# Paddle Inference on the same files, another process or thread pool: float32 reassociation
ATOL, RTOL = 1e-4, 1e-3


@pytest.fixture(scope="module")
def registered(server, step_outputs, tmp_path_factory, digits_task, digits_data):  # noqa: F811
    """The real track step, then the real register step: (name, version, run.json, dirs)."""
    from components.steps.register import RegisterParams
    from components.steps.register import run as register_run
    from components.steps.track import TrackParams
    from components.steps.track import run as track_run

    root = tmp_path_factory.mktemp("registered")
    all_params = {"task": {"name": "digits", "options": TASK_OPTIONS}}
    with global_tracking_uri(server):
        tracked = track_run(
            TrackParams(experiment="mlflow-model-tests"), all_params, root / "track", step_outputs
        )
    result = register_run(
        RegisterParams(min_accuracy=0.5),
        digits_task,
        root / "track",
        digits_data,
        root / "register",
        registry_params=RegistryParams(model_name=NAME),
        tracking_uri=server,
    )
    return SimpleNamespace(
        name=NAME,
        version=result.version,
        uri=f"models:/{NAME}/{result.version}",
        run_info=read_json(root / "track" / "run.json"),
        registration=read_json(root / "register" / "registration.json"),
        tracked=tracked,
        blessed=result.blessing.blessed,
    )


@pytest.fixture(scope="module")
def reference(exported_int8: Path, digits_task, digits_data: Path):
    """The bundle scored by the in-process Paddle runtime, as evaluate does: raw test
    images, labels, logits, predicted classes."""
    from components.tasks.scoring import score_model

    scores, predictor, _ = score_model(exported_int8, digits_task, digits_data)
    raw, _ = digits_task.read_split(digits_data, "test")
    logits = np.concatenate(  # the split as evaluate streams it, batch by batch
        [predictor.predict(inputs) for inputs, _ in digits_task.eval_batches(digits_data, "test")]
    )
    return SimpleNamespace(images=raw, labels=scores.y_true, logits=logits, y=scores.y_pred)


def assert_same_predictions(out: dict, ref: SimpleNamespace, n: int | None = None) -> None:
    from components.ml.decisions.gates import top1_mismatches

    logits = np.asarray(out["logits"], dtype=np.float32)
    expected = ref.logits[: n or len(ref.logits)]
    assert logits.shape == expected.shape
    np.testing.assert_allclose(logits, expected, atol=ATOL, rtol=RTOL)
    predicted = np.asarray(out["predicted"])
    # the class agrees except on near-ties within the tolerance (another CPU may pick either)
    assert top1_mismatches(logits, expected, ATOL, RTOL) == 0
    assert np.array_equal(predicted, logits.argmax(axis=1))
    probabilities = np.asarray(out["probabilities"])
    assert probabilities.shape == expected.shape
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert np.array_equal(probabilities.argmax(axis=1), predicted)


def test_track_logs_an_mlflow_model_and_register_versions_it(server, registered):  # noqa: F811
    from mlflow import MlflowClient

    from components.tracking.model import BUNDLE_TAG

    client = MlflowClient(tracking_uri=server, registry_uri=server)
    info = registered.run_info
    assert info["model_uri"] == f"models:/{info['model_id']}"
    assert info[BUNDLE_TAG] == registered.tracked.bundle_sha256
    run = client.get_run(info["run_id"])
    assert run.data.tags[BUNDLE_TAG] == info[BUNDLE_TAG]
    model = client.get_logged_model(info["model_id"])
    assert model.source_run_id == info["run_id"] and model.tags[BUNDLE_TAG] == info[BUNDLE_TAG]
    # the headline test metrics are linked to the logged model
    assert "test.accuracy" in {m.key for m in model.metrics or []}
    mv = client.get_model_version(registered.name, str(registered.version))
    # MLflow 3's form of a LoggedModel's version (the OSS registry keeps no model_id field:
    # the source and the tag carry it); downloads come from the model's own artifacts
    assert mv.source == info["model_uri"] and mv.run_id == info["run_id"]
    assert mv.tags["mlflow_model_id"] == info["model_id"]
    download_uri = client.get_model_version_download_uri(registered.name, str(registered.version))
    assert download_uri == model.artifact_location
    assert registered.registration["model_id"] == info["model_id"]
    assert registered.blessed
    assert BUNDLE_TAG in LINEAGE_TAGS
    for tag in LINEAGE_TAGS:
        assert mv.tags.get(tag), tag
    # the bundle is no longer a bare run artifact
    assert "model" not in {f.path for f in client.list_artifacts(info["run_id"])}


def test_pyfunc_load_model_predicts_like_the_paddle_runtime(server, registered, reference):  # noqa: F811
    import mlflow
    import pandas as pd

    with global_tracking_uri(server):
        model = mlflow.pyfunc.load_model(registered.uri)
    out = model.predict(reference.images)
    assert set(out) == {"predicted", "probabilities", "logits"}
    assert_same_predictions(out, reference)
    assert np.mean(out["predicted"] == reference.labels) > 0.5
    # the DataFrame layout: one column, one row per image, a flat list of H*W*C pixels
    frame = pd.DataFrame({"image": [img.reshape(-1).tolist() for img in reference.images[:16]]})
    assert_same_predictions(model.predict(frame), reference, 16)
    assert model.metadata.metadata["label_names"] == [str(i) for i in range(10)]


def test_the_version_has_a_signature_and_an_input_example(
    server,  # noqa: F811
    registered,
    digits_data,
    digits_task,
):
    import mlflow
    from mlflow.types.schema import TensorSpec

    with global_tracking_uri(server):
        info = mlflow.models.get_model_info(registered.uri)
        example = mlflow.models.Model.load(registered.uri).load_input_example()
    (spec,) = info.signature.inputs.inputs
    stored, _ = digits_task.read_head(digits_data, "test", len(example))  # as the shards hold
    assert isinstance(spec, TensorSpec)
    assert spec.type == np.dtype("uint8") and spec.shape == (-1, *stored.shape[1:])
    assert spec.shape == (-1, 8, 8, 1)  # builtin digits as ingest stores them
    outputs = {s.name: s for s in info.signature.outputs.inputs}
    assert set(outputs) == {"predicted", "probabilities", "logits"}
    assert outputs["logits"].shape == (-1, 10) and outputs["predicted"].type == np.dtype("int64")
    # the input example is real test images, as stored
    assert example.dtype == np.uint8 and np.array_equal(example, stored[: len(example)])


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_mlflow_models_serve_answers_like_the_paddle_runtime(
    server,  # noqa: F811
    registered,
    reference,
    tmp_path,
):
    """``mlflow models serve`` in a fresh process: another working directory, no PYTHONPATH
    (``components`` only as the installed package), the model fetched from the registry."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_REGISTRY_URI")}
    env["MLFLOW_TRACKING_URI"] = server
    # the venv first on PATH, as when it is activated: the scoring server execs `uvicorn`
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    log = tmp_path / "serve.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "models",
                "serve",
                "-m",
                registered.uri,
                "--env-manager",
                "local",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=tmp_path,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{base}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, "not ready in 180 s:\n" + log.read_text()[-4000:]
            time.sleep(0.5)
        n = 32
        answer = post_json(f"{base}/invocations", {"inputs": reference.images[:n].tolist()})
        assert_same_predictions(answer["predictions"], reference, n)
        frame = {
            "dataframe_split": {
                "columns": ["image"],
                "data": [[img.reshape(-1).tolist()] for img in reference.images[:n]],
            }
        }
        assert_same_predictions(
            post_json(f"{base}/invocations", frame)["predictions"], reference, n
        )
        # a wrong shape is the client's error, with the reason
        with pytest.raises(urllib.error.HTTPError) as err:
            post_json(f"{base}/invocations", {"inputs": np.zeros((1, 4, 4, 1), np.uint8).tolist()})
        assert err.value.code == 400
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group the test started (the server and its workers), then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def test_bundle_sha256_tag_is_the_hash_of_the_downloaded_bundle(
    server,  # noqa: F811
    registered,
    exported_int8,
    tmp_path,
):
    import mlflow
    from mlflow import MlflowClient

    from components.tracking.model import BUNDLE_TAG, bundle_dir, bundle_sha256
    from components.tracking.registry import download_version

    client = MlflowClient(tracking_uri=server, registry_uri=server)
    tag = client.get_model_version(registered.name, str(registered.version)).tags[BUNDLE_TAG]
    source = client.get_model_version_download_uri(registered.name, str(registered.version))
    root = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(tmp_path / "dl"), tracking_uri=server
        )
    )
    assert (root / "MLmodel").is_file()
    bundle = bundle_dir(root)
    assert bundle_sha256(bundle) == tag
    # the serving bundle, byte for byte, int8 programs included
    assert sha256_tree(bundle) == sha256_tree(exported_int8)
    assert {"int8/paddle/model.pdmodel", "int8/openvino/model.xml"} <= set(sha256_tree(bundle))
    # what the blessing scores: the same bundle, checked against the tag
    got = download_version(client, server, registered.name, registered.version, tmp_path / "b")
    assert bundle_sha256(got) == tag


def test_a_version_whose_files_differ_from_its_tag_is_refused(server, registered, tmp_path):  # noqa: F811
    from mlflow import MlflowClient

    from components.tracking.model import BUNDLE_TAG
    from components.tracking.registry import download_version

    client = MlflowClient(tracking_uri=server, registry_uri=server)
    mv = client.get_model_version(registered.name, str(registered.version))
    copy = client.create_model_version(
        registered.name,
        source=mv.source,
        run_id=mv.run_id,
        model_id=mv.tags["mlflow_model_id"],
        tags={**mv.tags, BUNDLE_TAG: "0" * 64},
    )
    with pytest.raises(StepError, match=f"differs from the version tag {BUNDLE_TAG} 000000000000"):
        download_version(client, server, registered.name, int(copy.version), tmp_path)


def test_promotion_refuses_a_version_without_bundle_sha256(server, registered):  # noqa: F811
    from mlflow import MlflowClient

    from components.tracking.model import BUNDLE_TAG

    client = MlflowClient(tracking_uri=server, registry_uri=server)
    mv = client.get_model_version(registered.name, str(registered.version))
    tags = {k: v for k, v in mv.tags.items() if k != BUNDLE_TAG}
    copy = client.create_model_version(
        registered.name,
        source=mv.source,
        run_id=mv.run_id,
        model_id=mv.tags["mlflow_model_id"],
        tags=tags,
    )
    registry = Registry(client, registered.name, RegistryParams())
    with pytest.raises(StepError, match=f"lineage tags missing: {BUNDLE_TAG}"):
        registry.promote(int(copy.version), force=True, reason="test")


def test_bundle_dir_names_what_is_missing(tmp_path):
    from components.tracking.model import bundle_dir

    with pytest.raises(StepError, match="not an MLflow model"):
        bundle_dir(tmp_path)
    (tmp_path / "MLmodel").write_text("flavors: {}\n")
    with pytest.raises(StepError, match="artifacts/bundle/signature.json not found"):
        bundle_dir(tmp_path)


def test_a_champion_registered_as_a_bare_bundle_is_still_scored(
    server,  # noqa: F811
    exported_int8,
    tmp_path,
    caplog,
):
    """Versions registered before this layout (the bundle as bare run artifacts ``model/``,
    no MLmodel, no bundle_sha256 tag) stay comparable: the blessing scores them as they are."""
    from mlflow import MlflowClient

    from components.tracking.registry import download_version

    client = MlflowClient(tracking_uri=server, registry_uri=server)
    exp = client.get_experiment_by_name("bare-bundle-tests")
    run = client.create_run(
        exp.experiment_id if exp else client.create_experiment("bare-bundle-tests")
    )
    client.log_artifacts(run.info.run_id, str(exported_int8), "model")
    client.set_terminated(run.info.run_id)
    name = "bare-bundle-classifier"
    client.create_registered_model(name)
    mv = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id
    )
    got = download_version(client, server, name, int(mv.version), tmp_path)
    assert sha256_tree(got) == sha256_tree(exported_int8)
    assert "is a bare bundle, not an MLflow model" in caplog.text
