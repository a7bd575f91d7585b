"""Registry, blessing, promotion, rollback and racing promotions against a real MLflow server.

Every test talks to an ``mlflow server`` process on a free loopback port (SQLite backend,
local artifact store), the way the pipeline does with ``MLFLOW_TRACKING_URI`` set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from components.core.artifacts import StepError, read_json, write_json
from components.ml.data import snapshot
from components.steps.promote import PromoteParams
from components.steps.promote import run as promote_run
from components.steps.register import RegisterParams
from components.steps.register import run as register_run
from components.tracking.registry import (
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    Registry,
    RegistryParams,
    global_tracking_uri,
)
from tests.conftest import REPO, untrained_export

PARAMS = RegisterParams(min_accuracy=0.5)
REGISTRY = RegistryParams()
LINEAGE = {
    "git_sha": "a" * 40,
    "data_sha256": "b" * 64,
    "params_sha256": "c" * 64,
    "ge_success": "true",
    "qat_gate_passed": "true",
    "serving_image_context_sha256": "d" * 64,
    "infra_validated": "true",
}
IMAGE = "paddle-mlops/digits-server:dddddddddddd"  # a build of that context would be pushed as


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A real ``mlflow server`` on 127.0.0.1 (the one ``make kfp-containers`` starts)."""
    from pipelines.containers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri


@pytest.fixture(scope="module")
def bad_export(tmp_path_factory, digits_task, digits_data) -> Path:
    """An untrained model, exported for real: what a broken training run would ship."""
    return untrained_export(tmp_path_factory.mktemp("bad_export"), digits_task, digits_data, 7)


# the digits_task fixture's options (what params.yaml: task.options would say)
TASK_OPTIONS = {"conv_channels": [6, 16], "augment_shift": 1}


def tracked_run(
    uri: str, export_dir: Path, data_dir: Path, dest: Path, tags: dict[str, str]
) -> Path:
    """What the track step leaves: an MLflow run with lineage tags, the bundle logged as its
    MLflow model (components.tracking.model, as track logs it) and run.json naming both."""
    import mlflow

    from components.tracking.model import BUNDLE_TAG, log_bundle_model

    with global_tracking_uri(uri):
        experiment = mlflow.set_experiment("registry-tests")
        with mlflow.start_run(experiment_id=experiment.experiment_id, tags=tags) as run:
            logged = log_bundle_model(export_dir, data_dir, "digits", TASK_OPTIONS)
            mlflow.set_tag(BUNDLE_TAG, logged.bundle_sha256)
    write_json(
        dest,
        {
            "run_id": run.info.run_id,
            "tracking_uri": uri,
            "model_id": logged.model_id,
            "model_uri": logged.model_uri,
            BUNDLE_TAG: logged.bundle_sha256,
        },
    )
    return dest


def cli(uri: str, *args: str, name: str = "digits-classifier") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": uri}
    return subprocess.run(
        [sys.executable, "-m", "components", "registry", "--model-name", name, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def registry(uri: str, name: str = "digits-classifier") -> Registry:
    from mlflow import MlflowClient

    return Registry(MlflowClient(tracking_uri=uri, registry_uri=uri), name, REGISTRY)


def register(
    server,
    tmp_path,
    export_dir,
    digits_task,
    digits_data,
    tags=LINEAGE,
    params=PARAMS,
    name="digits-classifier",
    auto_promote=True,
) -> SimpleNamespace:
    """The register then the promote step, as the pipeline runs them."""
    run_file = tracked_run(server, export_dir, digits_data, tmp_path / "run.json", tags)
    registered = register_run(
        params,
        digits_task,
        run_file,
        digits_data,
        tmp_path / "out",
        registry_params=RegistryParams(model_name=name),
        tracking_uri=server,
    )
    # what serving_image leaves: the validated image, not built on this machine
    write_json(tmp_path / "infra" / "infra.json", {"image": IMAGE, "built": False})
    promoted = promote_run(
        PromoteParams(auto_promote=auto_promote),
        tmp_path / "out",
        tmp_path / "infra",
        tmp_path / "promote",
        registry_params=RegistryParams(model_name=name),
    )
    return SimpleNamespace(
        version=registered.version, blessing=registered.blessing, promoted=promoted.promoted
    )


def test_first_model_is_blessed_and_becomes_champion(
    server, tmp_path, exported, digits_task, digits_data
):
    result = register(server, tmp_path, exported, digits_task, digits_data)
    assert result.blessing.blessed and result.promoted and result.version == 1
    reg = registry(server)
    assert reg.aliases() == {CHAMPION: 1, CHALLENGER: 1}
    tags = reg.version(1).tags
    for key, value in LINEAGE.items():
        assert tags[key] == value
    assert tags["blessed"] == "true" and tags["task"] == "digits"
    # lineage of the data: the snapshot (run.json has none here: register records its data
    # set's) and the keys of the samples the version was made from
    data = snapshot.load(digits_data)
    assert tags["snapshot_sha256"] == data.sha256
    assert tags["training_keys_count"] == str(data.rows("train") + data.rows("val"))
    assert tags["holdout_leak_check"] == "not checked: no pinned holdout yet"
    blessing = read_json(tmp_path / "out" / "blessing.json")
    assert blessing["blessed"] and blessing["champion"] is None
    assert blessing["challenger"]["accuracy"] > 0.5
    # the registered files are an MLflow model whose bundle is the export, byte for byte:
    # fp32 PIR, legacy, signature
    import mlflow

    from components.core.artifacts import sha256_tree
    from components.tracking.model import bundle_dir, bundle_sha256

    version = reg.aliases()[CHAMPION]
    source = reg.client.get_model_version_download_uri("digits-classifier", str(version))
    root = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=str(tmp_path / "dl"), tracking_uri=server
        )
    )
    assert "MLmodel" in os.listdir(root)
    bundle = bundle_dir(root)
    files = os.listdir(bundle)
    assert {"model.json", "model.pdiparams", "signature.json", "legacy"} <= set(files)
    assert sha256_tree(bundle) == sha256_tree(exported)
    assert tags["bundle_sha256"] == bundle_sha256(exported)


def test_worse_challenger_is_not_promoted_and_says_why(
    server, tmp_path, bad_export, digits_task, digits_data
):
    result = register(server, tmp_path, bad_export, digits_task, digits_data)
    assert not result.blessing.blessed and not result.promoted
    reasons = "\n".join(result.blessing.reasons)
    assert "points below champion v1" in reasons and "register.max_regression 0.0" in reasons
    reg = registry(server)
    assert reg.aliases()[CHAMPION] == 1 and reg.aliases()[CHALLENGER] == result.version
    tags = reg.version(result.version).tags
    assert tags["blessed"] == "false"
    # the same data set: nothing of the holdout in its training snapshot, nothing of the
    # test split in the champion's
    test_rows = snapshot.load(digits_data).rows("test")
    assert tags["holdout_leak_check"].startswith(f"passed: 0 of {test_rows} samples")
    assert json.loads(tags["champion_exclusions"])["test"]["excluded"] == 0

    proc = cli(server, "promote")  # the challenger, without --force
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"digits-classifier v{result.version} is not blessed" in proc.stderr
    assert "points below champion v1" in proc.stderr
    assert registry(server).aliases()[CHAMPION] == 1


def test_challenger_without_lineage_is_refused_even_when_forced(
    server, tmp_path, exported, digits_task, digits_data
):
    partial = {k: v for k, v in LINEAGE.items() if k not in ("data_sha256", "ge_success")}
    result = register(server, tmp_path, exported, digits_task, digits_data, tags=partial)
    assert not result.blessing.blessed
    assert "lineage tags missing: data_sha256, ge_success" in result.blessing.reasons[0]
    proc = cli(server, "promote", "--version", str(result.version), "--force", "--reason", "x")
    assert proc.returncode == 1
    assert "refusing to promote, lineage tags missing: data_sha256, ge_success" in proc.stderr
    assert registry(server).aliases()[CHAMPION] == 1


def test_forced_promotion_is_recorded_and_rollback_restores(server):
    reg = registry(server)
    worse = reg.aliases()[CHALLENGER]
    assert cli(server, "promote", "--version", "2", "--force").returncode == 1  # no reason
    proc = cli(server, "promote", "--version", "2", "--force", "--reason", "hotfix INC-42")
    assert proc.returncode == 0, proc.stderr
    assert reg.aliases()[CHAMPION] == 2 and reg.aliases()[PREVIOUS] == 1
    event = reg.history()[-1]
    assert event["forced"] and event["reason"] == "hotfix INC-42" and event["previous"] == 1
    assert reg.version(2).tags["forced_promotion_reason"] == "hotfix INC-42"

    proc = cli(server, "rollback", "--reason", "bad release")
    assert proc.returncode == 0, proc.stderr
    assert reg.aliases()[CHAMPION] == 1 and reg.aliases()[PREVIOUS] == 2
    assert reg.history()[-1]["action"] == "rollback"

    status = json.loads(cli(server, "status", "--json").stdout)
    assert status["champion"]["version"] == 1 and status["previous-champion"]["version"] == 2
    assert status["champion"]["tags"]["git_sha"] == LINEAGE["git_sha"]
    assert worse != 1
    # neither the forced promotion of v2 nor the rollback moved the pinned holdout
    assert status["holdout"]["holdout_version"] == "1"


def test_racing_promotions_leave_one_champion_and_a_consistent_history(
    server, tmp_path, exported, digits_task, digits_data
):
    versions = [
        register(
            server,
            tmp_path / str(i),
            exported,
            digits_task,
            digits_data,
            auto_promote=False,
        ).version
        for i in range(2)
    ]
    reg = registry(server)
    before = reg.aliases()[CHAMPION]
    n_history = len(reg.history())
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": server}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "components", "registry", "promote", "--version", str(v)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for v in versions
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    history = reg.history()[n_history:]
    assert [e["action"] for e in history] == ["promote", "promote"]
    first, second = history
    assert {first["version"], second["version"]} == set(versions)
    assert first["previous"] == before and second["previous"] == first["version"]
    aliases = reg.aliases()
    assert aliases[CHAMPION] == second["version"] and aliases[PREVIOUS] == first["version"]
    assert not reg.client.search_registered_models(f"name = '{reg.lock_name}'")  # released


def test_a_held_lock_makes_a_promotion_wait(server):
    reg = registry(server)
    target = reg.aliases()[PREVIOUS]
    with reg.lock():
        env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": server}
        proc = subprocess.Popen(
            [sys.executable, "-m", "components", "registry", "promote", "--version", str(target)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # event order, not a sleep: the promotion asked for the lock and was refused ...
        seen = []
        for line in proc.stderr:  # EOF (a promotion that did not wait) ends the loop
            seen.append(line)
            if "held by another promotion" in line:
                break
        assert "held by another promotion" in seen[-1], "".join(seen)
        # ... and is still waiting, the champion untouched, while the lock is held
        assert proc.poll() is None and reg.aliases()[CHAMPION] != target
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(seen) + err
    assert reg.aliases()[CHAMPION] == target


def test_a_stale_lock_left_by_a_crash_is_broken(server):
    reg = registry(server)
    reg.client.create_registered_model(
        reg.lock_name, tags={"token": "dead", "owner": "crashed", "acquired_at": "0"}
    )
    target = reg.aliases()[PREVIOUS]
    reg.promote(target, force=True, reason="after crash")
    assert reg.aliases()[CHAMPION] == target


def test_auto_promotion_refuses_if_the_champion_moved_meanwhile(server):
    reg = registry(server)
    aliases = reg.aliases()
    judged_against = aliases[CHAMPION] + 100  # the blessing saw another champion
    with pytest.raises(StepError, match="champion changed from"):
        reg.promote(aliases[PREVIOUS], force=True, reason="cas", expected_champion=judged_against)
    assert reg.aliases() == aliases


def test_rollback_without_previous_champion_is_a_readable_error(
    server, tmp_path, exported, digits_task, digits_data
):
    name = "lonely-classifier"
    register(server, tmp_path, exported, digits_task, digits_data, name=name)
    with pytest.raises(StepError, match="nothing to roll back to"):
        registry(server, name).rollback()


def relabel_split(data_dir: Path, dest: Path, split: str, labels) -> Path:
    """A copy of ``data_dir`` whose ``split`` carries ``labels`` (in stream order): its shards
    rewritten, their sha256, sizes and counts in the manifest updated."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.core.artifacts import sha256_file

    shutil.copytree(data_dir, dest)
    snap = snapshot.load(dest)
    doc = {k: v for k, v in snap.doc.items() if k != "format_version"}
    at = 0
    for entry in doc["shards"]:
        if entry["split"] != split:
            continue
        path = dest / entry["path"]
        table = pq.read_table(path)
        new = np.asarray(labels[at : at + table.num_rows], dtype=np.int64)
        at += table.num_rows
        table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(new))
        path.unlink()  # never write through a link into the original
        pq.write_table(table, path)
        values, counts = np.unique(new, return_counts=True)
        entry.update(
            sha256=sha256_file(path),
            bytes=path.stat().st_size,
            counts={str(int(v)): int(c) for v, c in zip(values, counts, strict=True)},
        )
    assert at == len(labels)
    snapshot.write_manifest(dest, doc)
    return dest


def test_pinned_holdout_catches_a_bad_challenger_that_corrupted_labels_hide(
    server, tmp_path, exported, bad_export, digits_task, digits_data
):
    """New data whose test labels are corrupted makes a bad model look *better* than the
    champion on that split; the first champion's pinned test split still tells them apart."""
    from components.tasks.scoring import score_model

    name = "holdout-classifier"
    params = RegisterParams(min_accuracy=0.0)
    first = register(
        server, tmp_path / "1", exported, digits_task, digits_data, params=params, name=name
    )
    assert first.promoted
    reg = registry(server, name)
    model_tags = reg.client.get_registered_model(name).tags
    assert model_tags["holdout_version"] == str(first.version)
    assert model_tags["holdout_sha256"] == snapshot.load(digits_data).split_sha256("test")
    assert model_tags["holdout_format"] == "snapshot"
    assert reg.status()["holdout"]["holdout_version"] == str(first.version)

    # a new batch whose test labels were corrupted: they agree with the bad model
    bad_predictions = score_model(bad_export, digits_task, digits_data, "test")[0].y_pred
    corrupted = relabel_split(digits_data, tmp_path / "corrupted", "test", bad_predictions)

    second = register(
        server, tmp_path / "2", bad_export, digits_task, corrupted, params=params, name=name
    )
    blessing = read_json(tmp_path / "2" / "out" / "blessing.json")
    on_test = blessing["comparisons"]["test"]
    assert on_test["passed"] and on_test["overall"]["better"] > on_test["overall"]["worse"]
    on_holdout = blessing["comparisons"]["holdout"]
    assert not on_holdout["passed"] and on_holdout["pinned_from_version"] == first.version
    assert on_holdout["overall"]["worse"] > 100 and on_holdout["overall"]["p_value"] < 1e-6
    assert not second.blessing.blessed and not second.promoted
    reasons = "\n".join(second.blessing.reasons)
    assert "on the pinned holdout: accuracy" in reasons and "below champion v1" in reasons
    tags = reg.version(second.version).tags
    assert json.loads(tags["blessing_holdout"])["passed"] is False
    assert json.loads(tags["blessing_test"])["passed"] is True
    assert reg.aliases()[CHAMPION] == first.version


def test_a_holdout_changed_after_pinning_is_refused(
    server, tmp_path, exported, digits_task, digits_data
):
    name = "holdout-classifier"
    reg = registry(server, name)
    pinned = reg.client.get_registered_model(name).tags["holdout_sha256"]
    reg.client.set_registered_model_tag(name, "holdout_sha256", "0" * 64)
    try:
        with pytest.raises(StepError, match="not the pinned 000000000000"):
            register(
                server,
                tmp_path,
                exported,
                digits_task,
                digits_data,
                params=RegisterParams(min_accuracy=0.0),
                name=name,
            )
    finally:
        reg.client.set_registered_model_tag(name, "holdout_sha256", pinned)


def test_the_judges_rollback_of_a_challenger_is_recorded_with_its_evidence(server):
    """A challenger rolled back on live traffic never was champion: the aliases stay, the
    history and the version say why."""
    from components.ml.decisions.judging import Judgement
    from components.steps.judge import record
    from components.tracking.registry import RegistryParams

    reg = registry(server)
    before = reg.aliases()
    challenger = reg.aliases()[CHALLENGER]
    verdict = Judgement(
        "rollback", ["service level breached: p99 latency 412.0 ms > 100"], {"pairs": 37}
    )
    done = record(verdict, server, "digits-classifier", RegistryParams(), str(challenger))
    assert done["event"]["action"] == "reject" and done["event"]["version"] == challenger
    assert reg.aliases() == before
    event = reg.history()[-1]
    assert event["action"] == "reject" and "p99 latency 412.0 ms" in event["reason"]
    tags = reg.version(challenger).tags
    assert tags["judged"] == "reject" and "judge on live traffic" in tags["judged_reason"]


def test_an_experiment_created_by_a_racing_process_is_still_the_active_one(server, monkeypatch):
    """Two pipelines starting together on a new experiment: the one whose create loses the
    race must log into that experiment, not MLflow's "Default" (MLflow 3's set_experiment
    returns without making it active on that path). The other process's create is made to
    land between this one's lookup and its create."""
    import mlflow
    from mlflow.tracking._tracking_service.client import TrackingServiceClient

    from components.tracking.registry import use_experiment

    name = "created-by-the-other-pipeline"
    lookup = TrackingServiceClient.get_experiment_by_name
    raced = []

    def lookup_then_lose_the_race(self, experiment_name):
        if experiment_name == name and not raced:  # the other process creates it now
            raced.append(mlflow.MlflowClient(tracking_uri=server).create_experiment(name))
            return None
        return lookup(self, experiment_name)

    monkeypatch.setattr(TrackingServiceClient, "get_experiment_by_name", lookup_then_lose_the_race)
    with global_tracking_uri(server):
        mlflow.set_experiment("Default")  # what a process starts with
        experiment = use_experiment(name)
        with mlflow.start_run() as run:
            pass
    assert raced, "the racing create did not happen"
    assert experiment.experiment_id == raced[0]
    assert run.info.experiment_id == raced[0]


def test_pipelines_writing_a_new_alias_at_once_all_succeed(server):
    """Two pipelines registering at once both set ``challenger`` for the first time: MLflow's
    SQL store reads then inserts, so the second insert violates the alias's unique key (seen
    in CI: sqlite3.IntegrityError, BAD_REQUEST). ``set_alias`` rides it out; the alias ends on
    one of the versions written."""
    import threading

    from mlflow import MlflowClient

    from components.tracking.registry import set_alias

    client = MlflowClient(server, server)
    name = "alias-race"
    client.create_registered_model(name)
    versions = [
        int(client.create_model_version(name, source=f"s3://bucket/m{i}").version) for i in range(3)
    ]
    errors: list[str] = []
    for round_ in range(30):  # without the retry, about 1 round in 5 lost a writer here
        alias = f"race-{round_}"
        start = threading.Barrier(4)

        def write(version: int, alias: str = alias, start: threading.Barrier = start) -> None:
            start.wait(timeout=30)
            try:
                set_alias(client, name, alias, version)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(f"{alias}: {exc}")

        threads = [threading.Thread(target=write, args=(versions[j % 3],)) for j in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert int(client.get_model_version_by_alias(name, alias).version) in versions
    assert not errors, errors[:3]


def test_set_alias_raises_other_errors_at_once(server, monkeypatch):
    """Only a concurrent first write of the alias is written again: any other error (here:
    no such model) is raised after one attempt, whose requests MLflow's transport does not
    repeat either. Counted on the way to the real server, which answers every call."""
    import urllib3
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from components.tracking.registry import set_alias

    client = MlflowClient(server, server)
    attempts: list[tuple] = []
    requests: list[str] = []
    set_registered_model_alias = client.set_registered_model_alias
    urlopen = urllib3.connectionpool.HTTPConnectionPool.urlopen  # a retry re-enters it

    def counted_alias(*args: object) -> None:
        attempts.append(args)
        set_registered_model_alias(*args)

    def counted_urlopen(pool, method, url, *args, **kwargs):
        requests.append(f"{method} {url}")
        return urlopen(pool, method, url, *args, **kwargs)

    monkeypatch.setattr(client, "set_registered_model_alias", counted_alias)
    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "urlopen", counted_urlopen)
    with pytest.raises(MlflowException, match="not found|does not exist|RESOURCE_DOES_NOT_EXIST"):
        set_alias(client, "no-such-model", "champion", 1)
    assert attempts == [("no-such-model", "champion", "1")]  # not retried
    assert requests and len(set(requests)) == len(requests), requests  # none sent again
