"""The images as containers (podman): a step in the component image as uid 10001 on a
read-only root filesystem, and the C++ server image serving a model, draining on SIGTERM and
refusing a missing model. Skipped, with the reason, where podman is not installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from components.core.ports import free_port
from tests.conftest import HAVE_PODMAN, NO_PODMAN, REPO

CONF = REPO / "containers" / "containers.conf"
pytestmark = pytest.mark.skipif(not HAVE_PODMAN, reason=NO_PODMAN)


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["podman", *args],
        env={**os.environ, "CONTAINERS_CONF": str(CONF)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode:
        raise AssertionError(f"podman {' '.join(args)}: {proc.stderr[-3000:]}")
    return proc


def test_images_are_tagged_by_content_labelled_non_root_and_without_compilers(images):
    proc = subprocess.run(
        [sys.executable, str(REPO / "containers" / "images.py"), "refs"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert {k: v["ref"] for k, v in images.items()} == json.loads(proc.stdout)
    for name in ("components", "server"):
        ref = images[name]["ref"]
        info = json.loads(podman("image", "inspect", ref).stdout)[0]
        assert info["Config"]["User"] == "10001:10001", name
        # the commit it was built from. A content tag keeps the first build's commit,
        # which may be one this clone never had (an image store shared between clones),
        # so only an image built in this run must carry this checkout's HEAD.
        revision = info["Config"]["Labels"]["org.opencontainers.image.revision"]
        commit = revision.removesuffix("-dirty")
        assert re.fullmatch(r"[0-9a-f]{40}", commit), (name, revision)
        if images[name]["built"]:
            head = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
            assert commit == head, (name, revision, head)
        for tool in ("g++", "cc", "cmake", "make"):
            found = podman(
                "run",
                "--rm",
                "--entrypoint",
                "/bin/sh",
                ref,
                "-c",
                f"command -v {tool}",
                check=False,
            )
            assert found.returncode != 0, f"{tool} in {name}: {found.stdout}"
    # 242 MB before the gRPC endpoint, 265 MB with it (libgrpc++ and its dependencies, ~23 MB)
    assert images["server"]["size_mb"] < 280


def test_every_shipped_image_has_a_cyclonedx_sbom_read_from_the_image(images):
    """build/sbom/<image>.cdx.json: valid CycloneDX 1.6, the Debian packages of the base
    (dpkg in the image) and, for the component image, its Python environment (cyclonedx-py
    in the image), named by package URL."""
    from components.kube.sbom import validate

    for name in ("components", "server"):
        document = json.loads((REPO / "build" / "sbom" / f"{name}.cdx.json").read_text())
        validate(document)
        assert document["metadata"]["component"]["name"] == images[name]["ref"]
        purls = {c.get("purl", "") for c in document["components"]}
        assert any(p.startswith("pkg:deb/debian/libgrpc++1.51@") for p in purls), name
        assert any(p.startswith("pkg:deb/debian/base-files@") for p in purls), name
    python = {c["name"].lower(): c for c in json.loads(
        (REPO / "build" / "sbom" / "components.cdx.json").read_text())["components"]
        if c.get("purl", "").startswith("pkg:pypi/")}  # fmt: skip
    for package in ("paddlepaddle", "mlflow", "model-signing", "openvino"):
        assert package in python, package
    assert python["paddlepaddle"]["version"].startswith("3.3")
    # removed after the install: it builds a Lark grammar on every jsonschema import (kfp, GE)
    assert "rfc3987-syntax" not in python


def test_a_step_runs_in_its_image_as_uid_10001_on_a_read_only_root(images, digits_data, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    shutil.copytree(digits_data, data)
    out.mkdir()
    out.chmod(0o777)  # the container's uid 10001 writes here, nowhere else
    ref = images["components"]["ref"]
    proc = podman(
        "run",
        "--rm",
        "--read-only",
        "--tmpfs",
        "/tmp:mode=1777",
        "--tmpfs",
        "/work:mode=1777",
        "-v",
        f"{data}:/data:ro",
        "-v",
        f"{out}:/out",
        ref,
        "sh",
        "-c",
        "id -u && ! touch /opt/paddle-mlops/x 2>/dev/null && "
        "python -m components validate --params /opt/paddle-mlops/params.yaml "
        "--data /data --report /out/validate",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "10001"
    summary = json.loads((out / "validate" / "summary.json").read_text())
    assert summary["success"] and summary["evaluated"] > 0
    assert (out / "validate" / "data_docs" / "index.html").is_file()
    assert (out / "validate").stat().st_uid == 10001
    # the commit the image was built from is the step's lineage (not "unknown")
    manifest = json.loads((out / "validate" / "manifest.json").read_text())
    label = json.loads(podman("image", "inspect", ref).stdout)[0]["Config"]["Labels"]
    assert manifest["git_sha"] == label["org.opencontainers.image.revision"] != "unknown"


def test_package_searches_the_serving_config_in_its_image_on_the_pods_cpus(
    images, exported, qat_out, tmp_path
):
    """The package step in the component image (its server binary, its wrk) with a container
    CPU limit of 1: the search measures only what such a pod can run (cgroup quota, not the
    host's CPUs), as the package task on a serving node pool would."""
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    # bounded by a trial count, not a time: the same trials on a quick host and a slow one
    params["package"]["tune"].update(budget_s=900, max_trials=5, concurrencies=[1, 4], repeats=0)
    assert params["package"]["model_config"]["workers"] == 2  # the written 2x1 does not fit
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    proc = podman(
        "run",
        "--rm",
        "--read-only",
        "--cpus",
        "1",
        "--tmpfs",
        "/tmp:mode=1777",
        "--tmpfs",
        "/work:mode=1777",
        "-v",
        f"{tmp_path / 'params.yaml'}:/params.yaml:ro",
        "-v",
        f"{exported}:/exported:ro",
        "-v",
        f"{qat_out[0]}:/qat:ro",
        "-v",
        f"{out}:/out",
        images["components"]["ref"],
        "python",
        "-m",
        "components",
        "package",
        "--params",
        "/params.yaml",
        "--exported",
        "/exported",
        "--int8",
        "/qat",
        "--bundle",
        "/out/bundle",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = json.loads((out / "bundle" / "tune.json").read_text())

    def cpus(settings: dict) -> int:
        return settings["workers"] * settings["threads_per_worker"]

    # the written 2x1 ran once as the reference; everything searched, every finalist and the
    # choice fit the pod's one CPU, whatever number of trials this host ran
    assert table["cpus"] == 1 and table["written_fits"] is False
    first, *rest = table["trials"]
    assert first["stage"] == "reference" and first["config"] == table["written"]
    assert rest and {cpus(t["settings"]) for t in rest} == {1}, table["trials"]
    assert cpus(table["chosen_settings"]) == 1
    assert all(load["requests"] > 0 for t in table["trials"] for load in t["loads"])
    assert "the written layout 2x1 needs 2 CPUs, this process may use 1" in proc.stderr
    shipped = json.loads((out / "bundle" / "model_config.json").read_text())
    assert {k: shipped[k] for k in table["chosen_settings"]} == table["chosen_settings"]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except OSError:
        return 0


def test_the_server_image_serves_a_model_and_drains_on_sigterm(images, exported_int8, tmp_path):
    import tritonclient.http as httpclient

    port = free_port()
    name = f"paddle-mlops-test-{port}"
    podman(
        "run",
        "-d",
        "--name",
        name,
        "--read-only",
        "-p",
        f"127.0.0.1:{port}:8080",
        "-v",
        f"{exported_int8}:/mnt/models:ro",
        images["server"]["ref"],
        "--variant=int8",
        "--model-name=digits",
    )
    try:
        deadline = time.monotonic() + 60
        while _get(f"http://127.0.0.1:{port}/v2/health/ready") != 200:
            assert time.monotonic() < deadline, podman("logs", name, check=False).stderr
            time.sleep(0.3)
        client = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        signature = json.loads((exported_int8 / "signature.json").read_text())
        spec = signature["inputs"][0]
        shape = [4, *spec["shape"][1:]]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        inp = httpclient.InferInput(spec["name"], shape, "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer("digits", [inp])
        out = result.as_numpy(signature["outputs"][0]["name"])
        assert out.shape[0] == 4 and np.isfinite(out).all()
        # hostile input: a readable 400, and the server keeps serving
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v2/models/digits/infer", data=b"{not json", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 400
        assert _get(f"http://127.0.0.1:{port}/v2/health/live") == 200
    finally:
        podman("stop", "--time", "30", name, check=False)
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name, check=False)
        logs = podman("logs", name, check=False)
        podman("rm", "-f", name, check=False)
    assert code.stdout.strip() == "0", logs.stderr[-2000:]  # SIGTERM: drained, clean exit


@pytest.mark.parametrize("broken", ["missing", "corrupt"])
def test_the_server_image_refuses_a_missing_or_corrupt_model(images, tmp_path, broken):
    model = tmp_path / "model"
    if broken == "corrupt":
        model.mkdir()
        (model / "signature.json").write_text("{ not json")
    args = ["-v", f"{model}:/mnt/models:ro"] if broken == "corrupt" else []
    proc = podman("run", "--rm", *args, images["server"]["ref"], check=False, timeout=120)
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert lines and "/mnt/models" in "\n".join(lines), lines


def test_the_whole_dag_runs_with_every_step_in_the_component_image(images, tmp_path):
    """``make kfp-containers`` on tiny params: kfp.local's DockerRunner (podman), uid 10001,
    read-only root, a real MLflow server; the champion names the image and commit that ran."""
    import yaml
    from mlflow import MlflowClient

    from tests.test_pipeline_kfp import tiny_params

    params = tiny_params()
    params["track"]["experiment"] = "kfp-containers"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    root = tmp_path / "root"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.containers",
            "--params",
            str(tmp_path / "params.yaml"),
            "--pipeline-root",
            str(root),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    for step in (
        "ingest-op",
        "train-op",
        "qat-op",
        "serving-image-op",
        "register-op",
        "promote-op-2",
    ):
        assert f"Task '{step}' finished with status" in log.replace("\x1b[96m", "").replace(
            "\x1b[0m", ""
        ), step
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    model = client.get_registered_model("digits-classifier")
    version = client.get_model_version("digits-classifier", model.aliases["champion"])
    tags = version.tags
    ref = images["components"]["ref"]
    assert tags["component_image"].startswith(f"{ref}@")
    label = json.loads(podman("image", "inspect", ref).stdout)[0]["Config"]["Labels"]
    assert tags["git_sha"] == label["org.opencontainers.image.revision"]
    assert tags["blessed"] == "true" and tags["infra_validated"] == "true"
    metrics = json.loads(next(root.rglob("evaluate-op/metrics")).read_text())
    assert metrics["accuracy"] > 0.5


def _predict(model_dir, task, data) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Test-split predictions of trained weights (dygraph, the train step's model)."""
    import paddle

    from components.ml.data import dataset

    model = task.build_model(len(dataset.read_label_names(data)))
    model.set_state_dict(paddle.load(str(model_dir / "model.pdparams")))
    model.eval()
    labels, predicted = [], []
    with paddle.no_grad():
        for batch, y in task.eval_batches(data, "test"):  # the split as a stream
            inputs = [paddle.to_tensor(a) for a in task.collate(batch)]
            predicted.append(model(*inputs).argmax(axis=1).numpy())
            labels.append(y)
    return np.concatenate(labels), np.concatenate(predicted), dataset.read_label_names(data)


def test_two_containers_train_as_the_nodes_of_a_paddlejob(images, digits_data, tmp_path):
    """The train step as the two worker pods of a collective PaddleJob: two containers from
    the component image on the host network, each with exactly the env the training-operator
    injects (pkg/controller.v1/paddlepaddle/envvar.go: worker 0 gets PADDLE_MASTER=
    $(POD_IP):port, the others <job>-worker-0:port, resolved here by --add-host) plus POD_IP
    from our template's downward API; data, params and checkpoints on a shared volume, each
    its own output volume. Rank 0 alone writes; both ranks end identical; the model passes
    the registry's champion gate against a single-process run of the same params."""
    import yaml

    from components.core.config import from_dict
    from components.ml.decisions.gates import compare, decide
    from components.steps.register import RegisterParams
    from components.steps.train import TrainParams, run
    from components.tasks import get_task

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"]["options"].update(conv_channels=[6, 16], augment_shift=1)
    params["train"].update(epochs=4, early_stopping={"patience": 100, "min_delta": 0.0})
    shared = tmp_path / "shared"
    shutil.copytree(digits_data, shared / "data")
    (shared / "params.yaml").write_text(yaml.safe_dump(params))
    outs = [tmp_path / f"out{i}" for i in range(2)]
    for d in (shared, *outs):
        d.mkdir(exist_ok=True)
        d.chmod(0o777)  # the containers' uid 10001 writes here

    job, port = f"digits-{os.getpid()}", free_port()
    names = [f"{job}-worker-{i}" for i in range(2)]
    operator_env = {"PYTHONUNBUFFERED": "0", "PADDLE_JOB_ID": job, "PADDLE_NNODES": "2"}
    masters = [f"127.0.0.1:{port}", f"{names[0]}:{port}"]  # $(POD_IP_DUMMY):port, worker-0
    try:
        for i, name in enumerate(names):
            env = {**operator_env, "PADDLE_MASTER": masters[i], "POD_IP": "127.0.0.1"}
            podman(
                "run", "-d", "--name", name, "--network", "host",
                "--add-host", f"{names[0]}:127.0.0.1",
                "--read-only", "--tmpfs", "/tmp:mode=1777", "--tmpfs", "/work:mode=1777",
                "-v", f"{shared}:/shared", "-v", f"{outs[i]}:/out",
                *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
                images["components"]["ref"],
                "python", "-m", "components", "train", "--params", "/shared/params.yaml",
                "--data", "/shared/data", "--checkpoints", "/shared/checkpoints",
                "--model", "/out/model", "--metrics", "/out/train.json",
                "--plots", "/out/train.csv",
            )  # fmt: skip
        codes = [podman("wait", n, timeout=600).stdout.strip() for n in names]
        logs = [podman("logs", n, check=False) for n in names]
    finally:
        podman("rm", "-f", *names, check=False)
    text = [log.stdout + log.stderr for log in logs]
    assert codes == ["0", "0"], "\n".join(t[-3000:] for t in text)

    digests = [re.search(r"rank (\d) of 2: parameters sha256 ([0-9a-f]{64})", t) for t in text]
    assert all(digests), text
    assert sorted(int(m.group(1)) for m in digests) == [0, 1]
    assert digests[0].group(2) == digests[1].group(2), "the nodes ended with different weights"
    writer = next(i for i, m in enumerate(digests) if m.group(1) == "0")
    assert sorted(p.name for p in outs[writer].iterdir()) == ["model", "train.csv", "train.json"]
    assert list(outs[1 - writer].iterdir()) == [], "only rank 0 writes outputs"
    assert "checkpoint after epoch 4 written" in text[writer]
    assert "checkpoint after epoch" not in text[1 - writer]
    recorded = json.loads((outs[writer] / "model" / "manifest.json").read_text())["distributed"]
    assert (
        recorded["world_size"] == 2 and recorded["rank_param_sha256"] == [digests[0].group(2)] * 2
    )

    # the same params in one process, here: the 2-node model must pass the champion gate
    task = get_task("digits", params["task"]["options"])
    train = from_dict(TrainParams, params["train"], where="params.yaml: train")
    run(train, task, digits_data, tmp_path / "single", checkpoint_dir=tmp_path / "ckpt")
    y, single, names_ = _predict(tmp_path / "single", task, digits_data)
    _, nodes, _ = _predict(outs[writer] / "model", task, digits_data)
    reg = from_dict(RegisterParams, params["register"], where="params.yaml: register")
    verdict = decide(
        compare(y, single, nodes, names_),
        reg.limits(),
        what="2-node model on test",
        reference="the single-process model",
        params_prefix="register",
        drop_param="max_regression",
        class_drop_param="max_class_regression",
    )
    assert verdict.passed, verdict.failures
    assert abs((nodes == y).mean() - (single == y).mean()) <= 0.02
