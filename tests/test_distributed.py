"""Data-parallel training through the train step: 2 CPU ranks (gloo) started by
``paddle.distributed.launch`` on 127.0.0.1, the env contract a Kubeflow PaddleJob injects,
rank-0-only side effects, kill-and-resume, and every task. The two-container version of the
same run is in ``tests/test_containers.py``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml

from components.core.artifacts import StepError, read_json
from components.ml.training.distributed import (
    Batching,
    DistributedParams,
    EpochShare,
    LaunchPlan,
    launch_command,
    plan,
)
from components.steps.train import TrainParams, run
from tests.conftest import REPO

EPOCHS = 4
DIGEST = re.compile(r"rank (\d) of 2: parameters sha256 ([0-9a-f]{64})")


# --------------------------------------------------------------------------- the env contract


def test_one_rank_runs_in_process_and_a_launched_rank_never_launches_again():
    assert plan(DistributedParams(), "cpu", env={}) is None
    two = DistributedParams(nproc=2)
    assert plan(two, "cpu", env={"PADDLE_MLOPS_RANK": "1", "PADDLE_NNODES": "2"}) is None
    local = plan(two, "cpu", env={})
    assert local == LaunchPlan(
        nnodes=1, nproc=2, backend="gloo", master=None, job_id="paddle-mlops-train",
        host="127.0.0.1",
    )  # fmt: skip
    assert local.world_size == 2


def test_a_paddlejob_pods_env_decides_nodes_master_and_job():
    """What the training-operator injects (PADDLE_MASTER, PADDLE_NNODES, PADDLE_JOB_ID) wins
    over params; on a cluster the launcher finds the pod's own address (no --host)."""
    env = {
        "PADDLE_MASTER": "mnist-master-0:36543",
        "PADDLE_NNODES": "3",
        "PADDLE_JOB_ID": "mnist",
    }
    got = plan(DistributedParams(nproc=2, nnodes=1), "cpu", env=env)
    assert got == LaunchPlan(3, 2, "gloo", "mnist-master-0:36543", "mnist", None)
    assert got.world_size == 6
    cmd = launch_command(got, ["train", "--params", "p.yaml"], Path("/logs"))
    assert cmd[:3] == [sys.executable, "-m", "paddle.distributed.launch"]
    assert cmd[-6:] == [sys.executable, "-m", "components", "train", "--params", "p.yaml"]
    flags = dict(zip(cmd[3:-6:2], cmd[4:-6:2], strict=True))
    assert flags["--nnodes"] == "3" and flags["--nproc_per_node"] == "2"
    assert flags["--master"] == "mnist-master-0:36543" and flags["--job_id"] == "mnist"
    assert "--host" not in flags
    # a loopback master (two containers on one host): ranks bind to 127.0.0.1
    loop = plan(DistributedParams(), "cpu", env={**env, "PADDLE_MASTER": "127.0.0.1:4000"})
    assert loop.host == "127.0.0.1" and loop.nproc == 1 and loop.world_size == 3
    assert plan(DistributedParams(), "cpu", env={**env, "POD_IP": "10.1.2.3"}).host == "10.1.2.3"


@pytest.mark.parametrize(
    ("params", "env", "message"),
    [
        (DistributedParams(nnodes=2), {}, "start every node with PADDLE_MASTER"),
        (DistributedParams(), {"PADDLE_NNODES": "2", "PADDLE_MASTER": "nohost"}, "host:port"),
        (DistributedParams(), {"PADDLE_NNODES": "two"}, "not a number of nodes"),
        (DistributedParams(nproc=2, backend="nccl"), {}, "training runs on CPU"),
    ],
)
def test_a_launch_that_cannot_work_is_refused_before_it_starts(params, env, message):
    with pytest.raises(StepError, match=message):
        plan(params, "cpu", env=env)


def test_bad_distributed_params_name_the_field(tmp_path, digits_data):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["distributed"].update(master="10.0.0.5")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    proc = _train_cli(path, digits_data, tmp_path / "m", tmp_path / "c")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "train.distributed: master: '10.0.0.5' is not host:port" in err
    assert "Traceback" not in err


def test_global_batch_and_learning_rate_scaling_are_explicit():
    base = dict(batch_size=64, learning_rate=0.1)
    same = Batching.resolve(DistributedParams(), **base, world_size=4)
    assert (same.global_batch, same.per_rank_batch, same.learning_rate) == (64, 16, 0.1)
    per_rank = Batching.resolve(
        DistributedParams(batch="per_rank", lr_scaling="linear", lr_base_batch=64),
        **base,
        world_size=4,
    )
    assert (per_rank.global_batch, per_rank.per_rank_batch) == (256, 64)
    assert per_rank.learning_rate == pytest.approx(0.4)
    sqrt = Batching.resolve(
        DistributedParams(batch="per_rank", lr_scaling="sqrt", lr_base_batch=64),
        **base,
        world_size=4,
    )
    assert sqrt.learning_rate == pytest.approx(0.2)
    assert per_rank.facts()["learning_rate_effective"] == pytest.approx(0.4)


@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_an_epoch_is_shared_in_equal_steps_and_weighted_to_the_global_mean(size):
    """Every rank runs the same steps; each step's samples add up to the global batch (the
    last step to what is left), the weighted means average to the step's mean, and at most
    ``size - 1`` samples are left unread (none in one process)."""
    rng = np.random.default_rng(size)
    for rows, batch in [(1206, 32), (1206, 30), (100, 7), (64, 32), (9, 8), (size, size)]:
        if batch < size:
            continue
        share = EpochShare(rows, batch, size)
        runs = [share.rank_rows(r) for r in range(size)]
        assert sum(runs) == share.used == rows - share.dropped
        assert 0 <= share.dropped < size and (size > 1 or share.dropped == 0)
        assert [share.start(r) for r in range(size)] == np.cumsum([0, *runs[:-1]]).tolist()
        for step in range(share.steps):
            sizes = [share.batch(r, step) for r in range(size)]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert sum(sizes) == (batch if step < share.steps - 1 or not share.last else share.last)
            losses = [rng.random(n) for n in sizes]  # per-sample losses of each rank
            averaged = np.mean([share.weight(r, step) * losses[r].mean() for r in range(size)])
            assert averaged == pytest.approx(np.concatenate(losses).mean())
        assert runs == [sum(share.batch(r, s) for s in range(share.steps)) for r in range(size)]
    with pytest.raises(ValueError, match="cannot be shared by"):
        EpochShare(100, 4, 8)


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_read_disjoint_samples_of_each_epoch(digits_data, digits_task, size):
    """What each rank's training batches hold in an epoch, read by the train step's own
    pipeline (pieces, loader, shuffle buffer): no sample on two ranks, and together the
    whole split but the at most ``size - 1`` samples the remainder rule leaves unread."""
    from components.ml.data import snapshot
    from tests.test_train import _keys_read

    train = snapshot.split_keys(digits_data, ["train"]).tolist()
    per_rank = [_keys_read(digits_data, digits_task, 1, rank, size) for rank in range(size)]
    seen = [k for keys in per_rank for k in keys]
    assert len(seen) == len(set(seen)), "a sample was read by two ranks"
    assert set(seen) <= set(train) and len(train) - len(seen) < size
    share = EpochShare(len(train), 32, size)
    assert [len(keys) for keys in per_rank] == [share.rank_rows(r) for r in range(size)]


# --------------------------------------------------------------------------- 2 ranks, for real


def _params_file(tmp_path: Path, *, nproc: int, log_dir: Path | None = None) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"]["options"].update(conv_channels=[6, 16], augment_shift=1)
    params["train"].update(
        epochs=EPOCHS, batch_size=32, early_stopping={"patience": 100, "min_delta": 0.0}
    )
    params["train"]["distributed"].update(nproc=nproc, log_dir=str(log_dir) if log_dir else None)
    path = tmp_path / f"params-{nproc}.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _train_cli(
    params: Path, data: Path, out: Path, ckpt: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """The train step's CLI in its own process group (a kill reaches every rank)."""
    return subprocess.Popen(
        [sys.executable, "-m", "components", "train", "--params", str(params),
         "--data", str(data), "--model", str(out), "--checkpoints", str(ckpt),
         "--metrics", f"{out}.json", "--plots", f"{out}.csv"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip


def _processes_with(arg: str) -> list[int]:
    """Live processes whose command line contains ``arg``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and arg.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _weights(model_dir: Path) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in paddle.load(str(model_dir / "model.pdparams")).items()}


@pytest.fixture(scope="module")
def single(tmp_path_factory, digits_data) -> Path:
    """The same training in one process: the reference."""
    root = tmp_path_factory.mktemp("single")
    proc = _train_cli(_params_file(root, nproc=1), digits_data, root / "model", root / "ckpt")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return root


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, digits_data) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    params = _params_file(root, nproc=2, log_dir=root / "logs")
    proc = _train_cli(params, digits_data, root / "model", root / "ckpt")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return root


def test_two_ranks_end_identical_and_record_the_run(two_ranks):
    logs = {n: (two_ranks / "logs" / f"workerlog.{n}").read_text() for n in (0, 1)}
    digests = {n: DIGEST.search(text) for n, text in logs.items()}
    assert all(digests.values()), "every rank logs its parameter digest"
    assert {int(m.group(1)) for m in digests.values()} == {0, 1}
    assert digests[0].group(2) == digests[1].group(2), "ranks ended with different parameters"
    manifest = read_json(two_ranks / "model" / "manifest.json")
    recorded = manifest["distributed"]
    assert recorded["rank_param_sha256"] == [digests[0].group(2)] * 2
    assert (recorded["world_size"], recorded["global_batch"], recorded["per_rank_batch"]) == (
        2,
        32,
        16,
    )
    metrics = read_json(f"{two_ranks / 'model'}.json")
    assert metrics["world_size"] == 2 and metrics["learning_rate_effective"] == 0.001
    assert metrics["epochs_run"] == EPOCHS


def test_only_rank_0_writes_checkpoints_and_outputs(two_ranks):
    logs = {n: (two_ranks / "logs" / f"workerlog.{n}").read_text() for n in (0, 1)}
    written = re.compile(r"checkpoint after epoch (\d+) written")
    assert [int(e) for e in written.findall(logs[0])] == list(range(1, EPOCHS + 1))
    assert written.findall(logs[1]) == []
    assert "rank 1 done; rank 0 writes the outputs" in logs[1]
    assert "best val_accuracy" in logs[0] and "best val_accuracy" not in logs[1]
    # the checkpoint (rank 0's) and the piece cache both ranks share (train.cache_mb)
    assert sorted(p.name for p in (two_ranks / "ckpt").iterdir()) == ["last", "pieces"]
    assert len((two_ranks / "model.csv").read_text().splitlines()) == EPOCHS + 1


def test_two_ranks_train_like_one_process(two_ranks, single):
    """``batch: global``: the same steps per epoch of the same global batch at the same
    learning rate, each a gradient of the global batch's mean; the batches differ (each rank
    draws from its own run of the epoch), so the runs agree statistically, not sample for
    sample: the first epoch's loss within 15 %, the last epoch's validation accuracy within
    3 points (measured: 6 % and 0.7 points)."""
    recorded = read_json(two_ranks / "model" / "manifest.json")["distributed"]
    alone = read_json(single / "model" / "manifest.json")["distributed"]
    assert recorded["steps_per_epoch"] == alone["steps_per_epoch"]
    assert recorded["samples_per_epoch"] == alone["samples_per_epoch"]
    assert recorded["rank_samples_per_epoch"] == [alone["samples_per_epoch"] // 2] * 2
    h2 = read_json(two_ranks / "model" / "history.json")
    h1 = read_json(single / "model" / "history.json")
    assert h2[0]["train_loss"] == pytest.approx(h1[0]["train_loss"], rel=0.15)
    assert len(h1) == len(h2) == EPOCHS
    assert abs(h1[-1]["val_accuracy"] - h2[-1]["val_accuracy"]) <= 0.03, (h1[-1], h2[-1])


@pytest.mark.parametrize("resume_nproc", [2, 1])
def test_killed_data_parallel_training_resumes_to_the_same_result(
    tmp_path, digits_data, two_ranks, resume_nproc
):
    """Killed at 2 ranks; resumed at 2 ranks: bit-identical to the uninterrupted run; at 1
    (``batch: global`` keeps the checkpoint valid): the remaining epochs are one process's
    (its own order of the samples), so the result agrees statistically."""
    params = _params_file(tmp_path, nproc=2, log_dir=tmp_path / "logs")
    ckpt = tmp_path / "ckpt"
    proc = _train_cli(params, digits_data, tmp_path / "model", ckpt)
    state = ckpt / "last" / "state.json"
    killed_after, deadline = None, time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists() and read_json(state)["epoch"] >= 2:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and paddle's launcher
            proc.wait(timeout=30)
            killed_after = read_json(state)["epoch"]
            break
        time.sleep(0.02)
    assert killed_after is not None and killed_after < EPOCHS, "training was not killed mid-run"
    deadline = time.monotonic() + 20  # the ranks die with their launcher: no orphan trains on
    while _processes_with(str(ckpt)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(str(ckpt)) == []
    assert read_json(state)["epoch"] == killed_after
    assert not (tmp_path / "model").exists(), "a killed run must not leave a complete model"

    if resume_nproc == 1:
        params = _params_file(tmp_path, nproc=1)
    resumed = _train_cli(params, digits_data, tmp_path / "model", ckpt)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    resumed_logs = (
        [(tmp_path / "logs" / f"workerlog.{n}").read_text() for n in (0, 1)]
        if resume_nproc == 2
        else [err]
    )
    for log in resumed_logs:
        assert f"resuming from checkpoint after epoch {killed_after}" in log
    assert read_json(state)["epoch"] == EPOCHS
    ref, got = _weights(two_ranks / "model"), _weights(tmp_path / "model")
    history = read_json(tmp_path / "model" / "history.json")
    reference = read_json(two_ranks / "model" / "history.json")
    if resume_nproc == 2:
        for key in ref:
            np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
        assert history == reference
    else:
        assert history[:killed_after] == reference[:killed_after]  # from the checkpoint
        assert abs(history[-1]["val_accuracy"] - reference[-1]["val_accuracy"]) <= 0.03


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_the_step_alone_stops_every_rank(tmp_path, digits_data, sig):
    """A pod's SIGTERM (passed on) or a SIGKILL of the step's process only (its launcher and
    ranks die with their parent): no rank trains on unsupervised."""
    params = _params_file(tmp_path, nproc=2)
    data = yaml.safe_load(params.read_text())
    data["train"]["epochs"] = 200
    params.write_text(yaml.safe_dump(data))
    secret = {"MLFLOW_TRACKING_PASSWORD": "hunter2-pw", "SOME_API_KEY": "hunter2-key"}
    proc = _train_cli(params, digits_data, tmp_path / "model", tmp_path / "ckpt", secret)
    state, deadline = tmp_path / "ckpt" / "last" / "state.json", time.monotonic() + 240
    while not state.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert state.exists() and proc.poll() is None, "training did not start"
    marker = str(tmp_path / "ckpt")  # in the command line of the step, launcher and ranks
    pids = _processes_with(marker)
    # the step, paddle's launcher, two ranks and each rank's loader workers (forked)
    assert len(pids) == 4 + 2 * data["train"]["loader_workers"]
    environs = {pid: Path(f"/proc/{pid}/environ").read_bytes() for pid in pids}
    assert sum(b"hunter2" in e for e in environs.values()) == 1, "only the step has them"
    assert b"hunter2" in environs[proc.pid]
    os.kill(proc.pid, sig)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 20
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker) == []
    assert read_json(state)["epoch"] < 200


def test_a_failing_rank_fails_the_step_with_its_error(tmp_path, digits_data):
    """A rank that cannot read its data (a truncated training shard): the step exits 1 with
    the rank's own message, which names the shard and its pinned sha256."""
    import shutil

    from components.ml.data import snapshot

    data = tmp_path / "data"
    shutil.copytree(digits_data, data)
    (shard,) = snapshot.load(data).split_shards("train")
    path = data / shard.path
    path.write_bytes(path.read_bytes()[: shard.bytes // 2])
    params = _params_file(tmp_path, nproc=2)
    proc = _train_cli(params, data, tmp_path / "model", tmp_path / "ckpt")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "data-parallel training failed" in err and "rank logs in" in err
    assert f"{path}: shard is" in err and shard.sha256 in err, err[-2000:]
    assert not (tmp_path / "model").exists()


# --------------------------------------------------------------------------- every task


def _sentiment_data(root: Path) -> tuple[Path, dict]:
    from components.steps.ingest import run as ingest_run
    from components.tasks import get_task
    from components.tasks.text_data import TextIngestParams
    from tests.test_sentiment import TINY, _reviews, _write_table

    _write_table(root / "r.csv", _reviews(60), "csv")
    options = {**TINY, "mlm": {"epochs": 1, "batch_size": 32}}
    out = root / "data"
    ingest_run(
        TextIngestParams(source=str(root / "r.csv"), kind="table"),
        get_task("sentiment", options),
        out,
    )
    return out, options


def _image_folder_data(root: Path) -> tuple[Path, dict]:
    from components.steps.ingest import run as ingest_run
    from components.tasks import get_task
    from components.tasks.image_data import IngestParams
    from tests.test_pipeline_image_folder import make_image_folder

    make_image_folder(root / "raw", per_class=12, size=32)
    options = {"arch": "resnet18", "image_size": [32, 32], "mean": [0.5] * 3, "std": [0.5] * 3}
    out = root / "data"
    ingest_run(
        IngestParams(source=str(root / "raw"), kind="image_folder", image_mode="RGB"),
        get_task("image_folder", options),
        out,
    )
    return out, options


@pytest.mark.parametrize("name", ["sentiment", "image_folder"])
def test_every_task_trains_with_two_ranks(tmp_path, name):
    from components.tasks import get_task

    data, options = (_sentiment_data if name == "sentiment" else _image_folder_data)(tmp_path)
    result = run(
        TrainParams(epochs=2, batch_size=16, distributed=DistributedParams(nproc=2)),
        get_task(name, options),
        data,
        tmp_path / "model",
        checkpoint_dir=tmp_path / "ckpt",
        task_params={"name": name, "options": options},
    )
    assert result is not None and result.epochs_run == 2
    recorded = read_json(tmp_path / "model" / "manifest.json")["distributed"]
    assert recorded["world_size"] == 2
    digests = recorded["rank_param_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert (tmp_path / "model" / "model_meta.json").exists()
