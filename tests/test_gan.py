"""The digits GAN (``task.name: digits_gan``): a task that is not a classifier, through the
same steps.

- the distance and the judge on their own (properties, not numbers of one CPU);
- the whole ``tasks/digits_gan/dvc.yaml`` pipeline with a tiny config: a generator exported,
  scored against its floor and ceiling, served by the C++ server, registered as
  ``digits-generator``, and a second run judged against it as the champion;
- the served generator answers like the exported one for the same latents (REST and gRPC);
- data-parallel training with 2 ranks ends with the same generator on both, and a killed
  run resumes to the same generator.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml
from conftest import REPO, SERVER_BIN, WIRING_LATENCY_BUDGET, clone_repo, set_params, sh

from components.core.config import load_params
from components.tasks import get_task
from components.tasks.base import Scores
from components.tasks.gan import ConditionalGAN, DigitsGanTask, frechet_distance

PARAMS = "tasks/digits_gan/params.yaml"
TINY_TRAIN = {"epochs": 3, "batch_size": 64}
TINY_OPTIONS = {"width": 16, "latent_dim": 8, "judge": {"epochs": 2}}


def _task(**options) -> DigitsGanTask:
    params = load_params(REPO / PARAMS)
    merged = {**params["task"]["options"], **TINY_OPTIONS, **options}
    task = get_task("digits_gan", merged)
    assert isinstance(task, DigitsGanTask)
    return task


# --------------------------------------------------------------------------- the distance


def test_the_distance_is_zero_for_one_set_symmetric_and_sees_a_shift():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((400, 6))
    b = rng.standard_normal((400, 6))
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8)
    assert frechet_distance(a, b) == pytest.approx(frechet_distance(b, a), rel=1e-9)
    shifted = frechet_distance(a, a + 3.0)  # same covariance: |shift|^2 = 6 * 9
    assert shifted == pytest.approx(54.0, rel=1e-6)
    assert frechet_distance(a, b) < 1.0 < frechet_distance(a, b * 3.0)


def test_bad_options_name_the_field():
    with pytest.raises(Exception, match="task.options"):
        get_task("digits_gan", {"image_size": [30, 30]})
    with pytest.raises(Exception, match="task.options"):
        get_task("digits_gan", {"quality": {"bootstrap": 2}})


@pytest.fixture(scope="module")
def judged(digits_data) -> tuple[DigitsGanTask, np.ndarray, np.ndarray]:
    task = _task()
    raw, labels = task.read_split(digits_data, "train")
    task.fit_preprocessing(raw, labels)
    return task, *task.eval_inputs(digits_data, "test")[0]


def test_the_judge_recognises_real_digits_and_rates_noise_far_from_them(judged, digits_data):
    task, _, labels = judged
    raw, real_labels = task.read_split(digits_data, "test")
    (real,) = task.preprocess(raw)
    preds, _ = task.judge(real)
    assert (preds == real_labels).mean() > 0.6  # two epochs: far above chance (0.1)
    noise = np.random.default_rng(1).uniform(-1, 1, real.shape).astype(np.float32)
    q_real = task.quality(real, real_labels, real)
    q_noise = task.quality(noise, real_labels, real)
    assert q_real["fid"] == pytest.approx(0.0, abs=1e-6) and q_real["agreement"] > 0.6
    assert q_noise["fid"] > 10 * max(q_real["fid"], 1.0)


def _scores(task: DigitsGanTask, images: np.ndarray, labels: np.ndarray, data: Path) -> Scores:
    return task.score(images, labels, data, "test", [str(i) for i in range(10)])


def test_a_generator_is_blessed_against_itself_and_noise_is_not(judged, digits_data):
    """The distance rule decides with evidence: the same images pass, noise fails."""
    task, _, labels = judged
    raw, _ = task.read_split(digits_data, "test")
    (real,) = task.preprocess(raw)
    real = real[: len(labels)]
    same = _scores(task, real, labels, digits_data)
    failures, facts = task.blessing_checks(same, same)
    assert failures == [] and facts["fid_increase_lower_bound"] <= facts["fid_increase_limit"]
    noise = np.random.default_rng(2).uniform(-1, 1, real.shape).astype(np.float32)
    failures, facts = task.blessing_checks(_scores(task, noise, labels, digits_data), same)
    assert len(failures) == 1 and "distance" in failures[0], failures
    report = same.report["generation"]
    assert report["fid_floor"] < report["fid_ceiling"]


def test_a_split_is_scored_batch_by_batch_as_if_at_once(judged, digits_data):
    """Evaluate streams the split: the fixed latents come out the same in any batches, and
    the judge fed 7 images at a time reports what it reports for all of them at once."""
    task, latent, labels = judged
    streamed = list(task.eval_batches(digits_data, "test", 7))
    assert np.array_equal(np.concatenate([b[0][0] for b in streamed]), latent)
    assert np.array_equal(np.concatenate([b[1] for b in streamed]), labels)
    paddle.seed(0)
    images = task.generate(ConditionalGAN(10, task.options).generator, latent, labels)
    whole = _scores(task, images, labels, digits_data)
    scorer = task.scorer(digits_data, "test", [str(i) for i in range(10)])
    for s in range(0, len(labels), 7):
        scorer.add(images[s : s + 7], labels[s : s + 7])
    parts = scorer.result()
    assert np.array_equal(parts.y_true, labels)
    assert np.mean(parts.y_pred == whole.y_pred) > 0.99  # near-ties may differ by batch size
    for key in ("fid", "fid_floor", "fid_ceiling", "judge_accuracy"):
        assert parts.metrics[key] == pytest.approx(whole.metrics[key], rel=1e-3, abs=1e-3), key
    # the images themselves are not kept: only a few per class for the sample grid
    assert parts.outputs is None
    assert all(len(g) <= task.options.eval.grid_columns for g in parts.details["grid"].values())


# --------------------------------------------------------------------------- the pipeline


def _tiny(repo: Path, **train) -> None:
    params = load_params(repo / PARAMS)
    params["task"]["options"] = {**params["task"]["options"], **TINY_OPTIONS}
    params["task"]["options"]["judge"] = {
        **load_params(REPO / PARAMS)["task"]["options"]["judge"],
        **TINY_OPTIONS["judge"],
    }
    (repo / PARAMS).write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(
        repo,
        params_file=PARAMS,
        train={**TINY_TRAIN, **train},
        evaluate={"latency": {"warmup": 1, "repeats": 2}},
        register={"min_accuracy": 0.0},  # a 3-epoch generator; the real floor is 0.9
        deploy={"target": "none"},  # no server left behind (tests/test_pipeline_dvc.py)
        package={"tune": {"budget_s": 0}},  # the search is tested in test_tuning
        serving_image={
            "builder": "none",
            "golden_samples": 16,
            "latency_requests": 5,
            **WIRING_LATENCY_BUDGET,
        },
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, server_binary) -> Path:
    repo = clone_repo(tmp_path_factory.mktemp("gan"))
    if not (repo / "data" / "raw" / "digits").exists():  # DVC-tracked: made as `make data` does
        sh(
            repo,
            sys.executable,
            "-m",
            "components.steps.ingest",
            "materialize",
            "--out",
            "data/raw/digits",
        )
    _tiny(repo)
    sh(repo, "dvc", "repro", PARAMS.replace("params.yaml", "dvc.yaml"))
    return repo


def test_the_gan_pipeline_runs_end_to_end(pipeline):
    repo = pipeline
    out, metrics = repo / "outputs" / "digits_gan", repo / "metrics" / "digits_gan"
    train = json.loads((metrics / "train.json").read_text())
    assert "best_val_fid" in train and "best_val_accuracy" not in train
    curves = (repo / "plots" / "digits_gan" / "train.csv").read_text().splitlines()
    assert curves[0] == "epoch,train_d_loss,train_g_loss,val_fid,val_agreement,lr"
    assert len(curves) == 1 + TINY_TRAIN["epochs"]

    signature = json.loads((out / "package" / "signature.json").read_text())
    assert [(i["name"], i["shape"], i["dtype"]) for i in signature["inputs"]] == [
        ("latent", [-1, TINY_OPTIONS["latent_dim"]], "float32"),
        ("label", [-1], "int64"),
    ]
    assert signature["outputs"] == [{"name": "image", "shape": [-1, 1, 28, 28], "dtype": "float32"}]
    assert (out / "package" / "assets" / "judge.pdparams").exists()  # the yardstick ships
    qat = json.loads((metrics / "qat.json").read_text())
    assert qat == {"gate_passed": False, "fp32_only": True, "int8_available": False}

    evaluate = json.loads((metrics / "evaluate.json").read_text())
    assert {"class_agreement", "fid", "fid_floor", "fid_ceiling", "judge_accuracy"} <= set(evaluate)
    assert "accuracy" not in evaluate  # the task names its metrics
    assert 0 <= evaluate["fid_floor"] < evaluate["fid_ceiling"]
    assert 0.0 <= evaluate["class_agreement"] <= 1.0
    grid = out / "evaluate" / "samples.png"
    assert grid.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    confusion = (repo / "plots" / "digits_gan" / "confusion.csv").read_text().splitlines()
    assert confusion[0] == "actual,predicted" and len(confusion) == 1 + evaluate["samples"]

    infra = json.loads((out / "serving_image" / "infra.json").read_text())
    assert infra["infra_validated"] is True
    answers = infra["variants"][0]["checks"]["answers"]
    assert "top1_agreement" not in answers and answers["max_abs_diff"] <= 1e-4

    db = sqlite3.connect(repo / "mlflow.db")
    versions = db.execute(
        "SELECT version FROM model_versions WHERE name = 'digits-generator'"
    ).fetchall()
    assert versions == [(1,)]
    logged = [p for root in ("mlruns", "mlartifacts") for p in (repo / root).rglob("samples.png")]
    assert logged, "the sample grid is not an MLflow artifact"


def test_a_second_run_is_judged_against_the_generator_champion(pipeline):
    """A second run of the same recipe (a setting that cannot change the model: early
    stopping's patience beyond the epochs run; training is seeded and deterministic on one
    machine) registers the same generator again: judged against the champion by the paired
    rules and the distance rule, it is blessed, with zero difference in the evidence. (The
    rules refusing a worse generator: test_a_generator_is_blessed_against_itself_and_noise_is_not.)
    """
    repo = pipeline
    set_params(repo, params_file=PARAMS, train={"early_stopping": {"patience": 9}})
    sh(repo, "dvc", "repro", PARAMS.replace("params.yaml", "dvc.yaml"))
    blessing = json.loads(
        (repo / "outputs" / "digits_gan" / "register" / "blessing.json").read_text()
    )
    assert blessing["version"] == 2 and blessing["champion"]["version"] == 1
    facts = blessing["task_rules"]["facts"]
    assert {"fid", "champion_fid", "fid_increase_lower_bound", "fid_increase_limit"} <= set(facts)
    test = blessing["comparisons"]["test"]["overall"]
    assert test["samples"] > 0 and (test["worse"], test["better"]) == (0, 0)  # the same images
    assert (blessing["blessed"], blessing["reasons"]) == (True, [])
    assert facts["fid"] == pytest.approx(facts["champion_fid"], rel=1e-6)
    assert facts["fid_increase_lower_bound"] <= facts["fid_increase_limit"]


def test_the_server_answers_like_the_exported_generator(pipeline, tmp_path):
    """Same latents and classes: the C++ server (REST and gRPC) returns the images the
    exported program returns in Paddle Inference."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from components.ml.serving.runtime import ModelFiles, PaddlePredictor
    from components.ml.serving.server import RunningServer

    bundle = pipeline / "outputs" / "digits_gan" / "package"
    rng = np.random.default_rng(11)
    latent = rng.standard_normal((12, TINY_OPTIONS["latent_dim"])).astype(np.float32)
    labels = rng.integers(0, 10, 12).astype(np.int64)
    expected = PaddlePredictor(ModelFiles.in_dir(bundle)).predict([latent, labels])
    server = RunningServer(SERVER_BIN, bundle, "fp32", "generator", tmp_path / "server.log")
    try:
        server.wait_ready(60)
        http = httpclient.InferenceServerClient(server.client.base_url.split("//")[1])
        inputs = [
            httpclient.InferInput("latent", list(latent.shape), "FP32"),
            httpclient.InferInput("label", list(labels.shape), "INT64"),
        ]
        inputs[0].set_data_from_numpy(latent, binary_data=True)
        inputs[1].set_data_from_numpy(labels, binary_data=True)
        got = http.infer("generator", inputs).as_numpy("image")
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        g_inputs = [
            grpcclient.InferInput("latent", list(latent.shape), "FP32"),
            grpcclient.InferInput("label", list(labels.shape), "INT64"),
        ]
        g_inputs[0].set_data_from_numpy(latent)
        g_inputs[1].set_data_from_numpy(labels)
        got_grpc = g.infer("generator", g_inputs).as_numpy("image")
    finally:
        assert server.stop() == 0
    assert got.shape == expected.shape == (12, 1, 28, 28)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3)
    np.testing.assert_array_equal(got_grpc, got)


# --------------------------------------------------------------------------- data parallel


def _params_file(tmp_path: Path, nproc: int, epochs: int = 2) -> Path:
    params = load_params(REPO / PARAMS)
    params["task"]["options"] = {**params["task"]["options"], **TINY_OPTIONS}
    params["task"]["options"]["judge"] = {
        **load_params(REPO / PARAMS)["task"]["options"]["judge"],
        **TINY_OPTIONS["judge"],
    }
    params["train"].update(TINY_TRAIN, epochs=epochs)
    params["train"]["distributed"].update(nproc=nproc, log_dir=str(tmp_path / f"logs-{nproc}"))
    path = tmp_path / f"params-{nproc}.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def _train(params: Path, data: Path, root: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOG_minloglevel": "2"}
    return subprocess.Popen(
        [sys.executable, "-m", "components", "train", "--params", str(params), "--data",
         str(data), "--model", str(root / "model"), "--checkpoints", str(root / "ckpt"),
         "--metrics", str(root / "train.json"), "--plots", str(root / "train.csv")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def _generator(model_dir: Path) -> dict[str, np.ndarray]:
    weights = paddle.load(str(model_dir / "model.pdparams"))
    return {k: v.numpy() for k, v in weights.items() if k.startswith("generator.")}


def test_two_ranks_train_the_same_generator(tmp_path, digits_data):
    proc = _train(_params_file(tmp_path, nproc=2), digits_data, tmp_path / "two")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    manifest = json.loads((tmp_path / "two" / "model" / "manifest.json").read_text())
    digests = manifest["distributed"]["rank_param_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]  # every parameter, both ranks
    assert manifest["distributed"]["world_size"] == 2
    generator = _generator(tmp_path / "two" / "model")
    assert generator and all(np.isfinite(v).all() for v in generator.values())


def test_a_killed_gan_run_resumes_to_the_same_generator(tmp_path, digits_data):
    params = _params_file(tmp_path, nproc=1, epochs=3)
    straight = _train(params, digits_data, tmp_path / "straight")
    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err[-3000:]
    root = tmp_path / "killed"
    proc = _train(params, digits_data, root)
    state = root / "ckpt" / "last" / "state.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists() and json.loads(state.read_text())["epoch"] >= 1:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "training ended before it could be killed"
    assert not (root / "model").exists()
    resumed = _train(params, digits_data, root)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0 and "resuming from checkpoint" in err, err[-3000:]
    a, b = _generator(tmp_path / "straight" / "model"), _generator(root / "model")
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_an_untrained_generator_is_far_from_real_digits(judged, digits_data):
    """The ceiling evaluate reports: a fresh generator's images are far from real ones."""
    task, latent, labels = judged
    paddle.seed(0)
    fresh = ConditionalGAN(10, task.options).generator
    images = task.generate(fresh, latent, labels)
    raw, _ = task.read_split(digits_data, "test")
    (real,) = task.preprocess(raw)
    assert images.shape == (len(labels), 1, 28, 28)
    assert task.quality(images, labels, real)["fid"] > 10 * frechet_distance(
        *np.array_split(task.judge(real)[1], 2)
    )
