"""The hpo step for real: its CLI on the suite's digits snapshot, trials that are the train
step's own command, tiny budgets (2 trials of 1 epoch, 2 paired seeds).

- off: an overlay that sets nothing, no study, and train trains on params.yaml's values;
- a search that adopts nothing leaves the overlay (train's DVC dependency) byte for byte as
  the step off left it, whatever it found; only decision.yaml beside it differs;
- the search never opens a test or holdout shard: armed file-access failpoints kill any
  process that does (the trials inherit them), and a failpoint on the train shards, armed in
  train's processes only, proves they reach the trials; the trials' data view holds only the
  train and val shards (keys checked while a killed search leaves its view behind);
- a typo in ``hpo.space`` is one error line naming the closest key;
- a search killed after its first trial resumes without repeating it;
- a winner clearly better on every paired seed is adopted and ``train --hpo`` trains on it;
  the same winner under a gain bar it cannot clear is not adopted;
- the trial command's output, stdout and stderr merged as Katib's StdOut collector wraps it,
  parses as Katib's collector parses it (tests/test_hpo_trial_image.py: in the image).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from components.core import overrides
from components.ml.training.trial_metrics import KATIB_DEFAULT_FILTER
from tests.conftest import (
    REPO,
    cmdline,
    descendants,
    kill_and_expect_no_survivors,
    reap,
    run_module,
    set_params,
)

# a tiny real search: 2 trials of 1 epoch, adoption on 2 paired seeds of 1 epoch, a small net
TINY: dict[str, dict] = {
    "task": {"options": {"conv_channels": [6, 16]}},
    "train": {"epochs": 1},
    "hpo": {
        "enabled": True,
        "trial_epochs": 1,
        "budget": {"trials": 2, "cpus_per_trial": 1},
        "sampler": {"name": "random", "seed": 0},
        "pruner": {"name": "none"},
        "adopt": {"seeds": 2},
    },
}
# a pinned holdout is a snapshot of a test split (snapshot.subset): its shards open as split
# "test"; "holdout" is armed too, should a snapshot ever name a split so
NO_TEST_OR_HOLDOUT = "snapshot.open.test=kill,snapshot.open.holdout=kill"


def write_params(root: Path, space: dict[str, Any] | None = None, **updates: dict) -> Path:
    """params.yaml with ``updates`` merged in and ``hpo.space`` replaced by ``space``."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text())
    set_params(root, **updates)
    if space is not None:
        params = yaml.safe_load(path.read_text())
        params["hpo"]["space"] = space
        path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run_hpo(
    root: Path, params: Path, data: Path, *sets: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m components hpo`` as dvc.yaml runs it: outputs under ``root``."""
    args = ["--out", root / "hpo", "--study", root / "study", "--metrics", root / "hpo.json"]
    return run_module(
        "components", "hpo", "--params", str(params), "--data", str(data),
        *map(str, args), *(f"--set={s}" for s in sets), cwd=root, env=env,
    )  # fmt: skip


def run_train(
    root: Path, params: Path, data: Path, hpo: Path, *sets: str
) -> subprocess.CompletedProcess[str]:
    """``python -m components train --hpo <hpo>``: the train stage after the search."""
    out = root / "train"
    return run_module(
        "components", "train", "--params", str(params), "--data", str(data), "--hpo", str(hpo),
        "--model", str(out / "model"), "--checkpoints", str(out / "checkpoints"),
        "--metrics", str(out / "train.json"), "--plots", str(out / "train.csv"),
        *(f"--set={s}" for s in sets), cwd=root,
    )  # fmt: skip


def trials(root: Path) -> dict[str, Any]:
    return json.loads((root / "hpo" / "trials.json").read_text())


def overlay(root: Path) -> dict[str, Any]:
    return yaml.safe_load((root / "hpo" / overrides.OVERLAY).read_text())


def decision(root: Path) -> dict[str, Any]:
    return yaml.safe_load((root / "hpo" / overrides.DECISION).read_text())


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


# --------------------------------------------------------------------------- off


def test_off_writes_an_overlay_that_sets_nothing_and_runs_no_trial(tmp_path, digits_data):
    params = write_params(tmp_path, **{k: v for k, v in TINY.items() if k != "hpo"})
    ok(run_hpo(tmp_path, params, digits_data))
    assert overlay(tmp_path) == {"adopted": False, "params": {}}
    assert decision(tmp_path) == {
        "adopted": False,
        "reason": "hpo.enabled is false",
        **dict.fromkeys(("engine", "study", "trial", "objective")),
        "winner_params": {},
        "evidence": {
            **{k: [] for k in ("seeds", "current", "winner", "diffs")},
            **{"mean": None, "lower_bound": None, "rule": ""},
        },
    }
    metrics = json.loads((tmp_path / "hpo.json").read_text())
    assert metrics["enabled"] is False and metrics["adopted"] is False and metrics["trials"] == 0
    # no trial ran: no study journal, no trial scratch, no trials.json, no plots
    assert not (tmp_path / "study" / "journal.log").exists()
    assert not (tmp_path / "study" / "trials").exists()
    assert sorted(p.name for p in (tmp_path / "hpo").iterdir()) == [
        "decision.yaml",
        "manifest.json",
        "overlay.yaml",
    ]
    manifest = json.loads((tmp_path / "hpo" / "manifest.json").read_text())
    assert set(manifest["outputs"]) == {"overlay", "decision"} and manifest["adopted"] is False
    assert manifest["reason"] == "hpo.enabled is false"

    proc = ok(run_train(tmp_path, params, digits_data, tmp_path / "hpo"))
    assert "overlay.yaml sets nothing (decision.yaml beside it says why)" in proc.stderr
    trained = json.loads((tmp_path / "train" / "model" / "manifest.json").read_text())["params"]
    base = yaml.safe_load(params.read_text())["train"]
    assert {k: trained[k] for k in ("learning_rate", "batch_size", "seed")} == {
        k: base[k] for k in ("learning_rate", "batch_size", "seed")
    }


def test_a_search_that_adopts_nothing_leaves_trains_dependency_byte_for_byte(tmp_path, digits_data):
    """The overlay train depends on (``outputs/hpo/overlay.yaml`` in dvc.yaml) holds only what
    train applies: the step off, and two searches that differ (another space: another study)
    and adopt nothing, leave the same bytes, so ``dvc repro`` does not rerun train; only
    ``decision.yaml`` beside it says what each found and why. A search of one trial (the
    current params, 1 epoch): its best is trial 0, so no adoption seeds run."""
    params = write_params(tmp_path, **{k: v for k, v in TINY.items() if k != "hpo"})
    ok(run_hpo(tmp_path, params, digits_data))
    file = tmp_path / "hpo" / overrides.OVERLAY
    off = file.read_bytes()
    assert off == b"adopted: false\nparams: {}\n"
    decisions = [decision(tmp_path)]
    one_trial = {**TINY, "hpo": {**TINY["hpo"], "budget": {"trials": 1, "cpus_per_trial": 1}}}
    for other in (1.0e-6, 1.0e-7):
        space = {"train.learning_rate": {"type": "categorical", "choices": [0.001, other]}}
        ok(run_hpo(tmp_path, write_params(tmp_path, space, **one_trial), digits_data))
        assert [t["number"] for t in trials(tmp_path)["trials"]] == [0]
        assert file.read_bytes() == off
        decisions.append(decision(tmp_path))
    _, first, second = decisions
    for found in (first, second):
        assert found["adopted"] is False and found["trial"] == 0
        assert found["winner_params"] == {"train.learning_rate": 0.001}
        assert "the best trial 0 is the current params" in found["reason"]
    assert len({d["reason"] for d in decisions}) == 2  # off, and the searches' one line
    assert len({d["study"] for d in decisions}) == 3  # none, and two studies


# --------------------------------------------------------------------------- test/holdout


def test_a_test_shard_failpoint_kills_the_process_that_opens_one(digits_data):
    """Positive control: ``snapshot.open.test`` is a live point (a process opening a test
    shard dies), so a search that finishes under it did not open one."""
    code = (
        "from components.ml.data import snapshot\n"
        f"snap = snapshot.load({str(digits_data)!r})\n"
        "for shard in snap.shards:\n"
        "    print(shard.split, flush=True)\n"
        "    snapshot.open_shard(snap, shard)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PADDLE_MLOPS_FAILPOINTS": NO_TEST_OR_HOLDOUT}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert proc.stdout.split() == ["train", "val", "test"]  # died at the test shard
    assert "failpoint snapshot.open.test: kill" in proc.stderr


def test_the_search_never_opens_a_test_or_holdout_shard(tmp_path, digits_data):
    space = {"train.learning_rate": {"type": "categorical", "choices": [0.001, 0.003]}}
    params = write_params(tmp_path, space, **TINY)
    ok(run_hpo(tmp_path, params, digits_data, env={"PADDLE_MLOPS_FAILPOINTS": NO_TEST_OR_HOLDOUT}))
    found = trials(tmp_path)
    assert [(t["number"], t["state"]) for t in found["trials"]] == [
        (0, "COMPLETE"),
        (1, "COMPLETE"),
    ]
    metrics = json.loads((tmp_path / "hpo.json").read_text())
    assert (metrics["trials"], metrics["complete"], metrics["fail"]) == (2, 2, 0)
    # the adoption runs (when trial 1 won) inherited the failpoints too and finished
    evidence = decision(tmp_path)["evidence"]
    assert evidence["seeds"] in ([], [42, 43])


def test_a_train_shard_failpoint_in_train_processes_fails_every_trial(tmp_path, digits_data):
    """Positive control: the failpoints reach the trials (armed in the train step's
    processes only, so the driver itself, which never opens a shard, is not the one killed)."""
    space = {"train.learning_rate": {"type": "categorical", "choices": [0.001, 0.003]}}
    params = write_params(tmp_path, space, **TINY)
    proc = ok(
        run_hpo(
            tmp_path,
            params,
            digits_data,
            env={"PADDLE_MLOPS_FAILPOINTS": "snapshot.open.train@train=kill"},
        )
    )
    rows = trials(tmp_path)["trials"]
    assert [t["state"] for t in rows] == ["FAIL", "FAIL"]
    assert all(t["error"].startswith("exit -9") for t in rows), rows
    assert overlay(tmp_path) == {"adopted": False, "params": {}}
    decided = decision(tmp_path)
    assert decided["adopted"] is False and decided["trial"] is None
    assert decided["reason"] == "hpo: kept current params: no trial completed"
    assert decided["reason"] in proc.stderr


# --------------------------------------------------------------------------- the space


def test_a_typo_in_the_space_is_one_line_naming_the_closest_key(tmp_path, digits_data):
    space = {"train.lerning_rate": {"type": "float", "low": 0.0003, "high": 0.01, "log": True}}
    params = write_params(tmp_path, space, **TINY)
    proc = run_hpo(tmp_path, params, digits_data)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "train.lerning_rate" in line]
    assert len(lines) == 1, proc.stderr
    assert "hpo.space: train.lerning_rate: no such key" in lines[0]
    assert "did you mean train.learning_rate" in lines[0]
    assert not (tmp_path / "study" / "journal.log").exists()  # refused before any trial


# --------------------------------------------------------------------------- resume


def _journal(root: Path) -> list[tuple[int, str, Any, Any, Any]]:
    """(number, state, params, value, start time) of every trial of the one study."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(root / "study" / "journal.log")))
    (name,) = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    return [
        (t.number, t.state.name, t.params, t.value, t.datetime_start)
        for t in study.get_trials(deepcopy=False)
    ]


def test_a_killed_search_resumes_without_repeating_its_finished_trial(tmp_path, digits_data):
    # the current learning rate is the best choice: whatever trial 1 samples, the baseline
    # wins and no adoption seeds run (what is tested here is the resume)
    space = {"train.learning_rate": {"type": "categorical", "choices": [0.001, 1.0e-6]}}
    params = write_params(tmp_path, space, **TINY)
    killed = run_hpo(
        tmp_path, params, digits_data, env={"PADDLE_MLOPS_FAILPOINTS": "hpo.after_trial=kill"}
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (tmp_path / "hpo").exists()  # no overlay from a search that did not end
    before = _journal(tmp_path)
    assert [(n, s) for n, s, *_ in before] == [(0, "COMPLETE")]

    # while it is left behind, the trials' data view: the train and val shards, nothing else
    view = tmp_path / "study" / "view"
    shards = json.loads((view / "snapshot.json").read_text())["shards"]
    assert {s["split"] for s in shards} == {"train", "val"}
    assert sorted(p.name.rsplit("-", 2)[1] for p in (view / "shards").iterdir()) == ["train", "val"]
    # and what trial 0 read, by its own manifest's keys: the view's train and val splits
    manifest = json.loads(
        (tmp_path / "study" / "trials" / "0" / "model" / "manifest.json").read_text()
    )
    inputs = manifest["inputs"]
    assert set(inputs) == {"train:snapshot.json", "val:snapshot.json"}
    assert {Path(i["path"]) for i in inputs.values()} == {view / "snapshot.json"}

    ok(run_hpo(tmp_path, params, digits_data))
    after = _journal(tmp_path)
    assert after[0] == before[0]  # trial 0 is the same record: not run again
    assert [(n, s) for n, s, *_ in after] == [(0, "COMPLETE"), (1, "COMPLETE")]
    rows = trials(tmp_path)["trials"]
    assert [(t["number"], t["stale"], t["retry_of"]) for t in rows] == [
        (0, False, None),
        (1, False, None),
    ]
    assert rows[0]["params"] == {"train.learning_rate": 0.001}
    metrics = json.loads((tmp_path / "hpo.json").read_text())
    assert metrics["trials"] == 2 == TINY["hpo"]["budget"]["trials"]
    assert not overlay(tmp_path)["adopted"]
    assert not view.exists()  # a finished search removes its view


HANG_IN_TRIAL = "snapshot.open.train@train=hang"


def test_a_killed_search_leaves_no_trial_running(tmp_path, digits_data):
    """SIGKILL the search driver while a trial runs: the trial (in a session of its own, out
    of reach of a signal to the driver's group) and everything it started are gone within
    5 s, by the kernel (the parent-death signal), with no handler of the driver run. The
    trial hangs at its first train shard (a failpoint), so nothing else would end it: not
    even its writes to the dead driver's pipes (Python ignores SIGPIPE; logging drops what
    it cannot write)."""
    space = {"train.learning_rate": {"type": "categorical", "choices": [0.001, 0.003]}}
    params = write_params(tmp_path, space, **TINY)
    args = ["--out", tmp_path / "hpo", "--study", tmp_path / "study", "--metrics", tmp_path / "m"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "components", "hpo", "--params", params, "--data", digits_data,
         *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "PADDLE_MLOPS_FAILPOINTS": HANG_IN_TRIAL},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    tree: list[int] = []
    try:
        for _ in range(3000):  # a bound on polls, not on time: until trial 0's process runs
            tree = descendants(driver.pid)
            if any(" train " in cmdline(p) for p in tree) or driver.poll() is not None:
                break
            time.sleep(0.1)
        assert any(" train " in cmdline(p) for p in tree), f"no trial; exit {driver.poll()}"
        tree = descendants(driver.pid)  # the trial and what it started by now
        kill_and_expect_no_survivors(driver, tree)
    finally:
        reap(driver, tree)
        assert driver.stderr is not None
        driver.stderr.close()


# --------------------------------------------------------------------------- adoption


def test_a_clearly_better_winner_is_adopted_and_train_uses_it(tmp_path, digits_data):
    """Current params that cannot learn in one epoch (learning rate 1e-6) against 0.003: the
    winner is better on both paired seeds by far more than their noise, so the real rule
    adopts it; ``train --hpo`` then trains on it. The same search under a gain bar of 1.0
    (accuracy units: no gain clears it) keeps the current params."""
    space = {"train.learning_rate": {"type": "categorical", "choices": [1.0e-6, 0.003]}}
    low_lr = {**TINY, "train": {**TINY["train"], "learning_rate": 1.0e-6}}
    params = write_params(tmp_path, space, **low_lr)
    proc = ok(run_hpo(tmp_path, params, digits_data))
    rows = trials(tmp_path)["trials"]
    assert [t["params"]["train.learning_rate"] for t in rows] == [1.0e-6, 0.003]
    decided = decision(tmp_path)
    assert decided["adopted"] is True, decided["reason"]
    assert decided["winner_params"] == {"train.learning_rate": 0.003}
    assert decided["trial"] == 1 and decided["objective"] == "val_accuracy"
    assert overlay(tmp_path) == {  # what train applies, and nothing else
        "adopted": True,
        "params": {"train.learning_rate": 0.003},
        "engine": "optuna",
        "study": decided["study"],
        "trial": 1,
        "objective": "val_accuracy",
    }
    assert decided["reason"].startswith("hpo: adopted trial 1: val_accuracy +")
    assert decided["reason"] in proc.stderr
    evidence = decided["evidence"]
    assert evidence["seeds"] == [42, 43] and all(d > 0 for d in evidence["diffs"])
    assert evidence["lower_bound"] > 0
    assert json.loads((tmp_path / "hpo.json").read_text())["adopted"] is True

    train = ok(run_train(tmp_path, params, digits_data, tmp_path / "hpo"))
    assert "train.learning_rate=0.003" in train.stderr  # the overlay, read and logged
    trained = json.loads((tmp_path / "train" / "model" / "manifest.json").read_text())["params"]
    assert trained["learning_rate"] == 0.003
    # the command line still wins over the overlay (--set is applied after it)
    ok(run_train(tmp_path, params, digits_data, tmp_path / "hpo", "train.learning_rate=0.002"))
    trained = json.loads((tmp_path / "train" / "model" / "manifest.json").read_text())["params"]
    assert trained["learning_rate"] == 0.002

    # a bar no gain can clear: the same winner, better on every seed, is not adopted; its
    # paired runs are the same runs, so their recorded scores decide (nothing trains again)
    record = tmp_path / "study" / "adoption_runs.jsonl"
    runs = record.read_text().splitlines()
    assert len(runs) == 4  # 2 seeds x (current, winner)
    again = ok(run_hpo(tmp_path, params, digits_data, "hpo.adopt.min_gain=1.0"))
    assert record.read_text().splitlines() == runs
    assert again.stderr.count(f"recorded in {record}") == 4
    assert overlay(tmp_path) == {"adopted": False, "params": {}}
    refused = decision(tmp_path)
    assert refused["adopted"] is False
    assert refused["winner_params"] == {"train.learning_rate": 0.003}  # found, not adopted
    assert refused["reason"].startswith("hpo: kept current params: winner trial 1 val_accuracy +")
    assert refused["reason"].endswith("<= 1 (2 seeds)")
    assert all(d > 0 for d in refused["evidence"]["diffs"])
    assert overrides.read_overlay(tmp_path / "hpo") == {}  # what train would set: nothing
    assert len(trials(tmp_path)["trials"]) == 2  # the same study: the budget was spent


# --------------------------------------------------------------------------- Katib's format

RFC3339NANO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")


def katib_observations(text: str, metrics: list[str]) -> list[tuple[str | None, str, float]]:
    """(timestamp or None, name, value) as Katib's StdOut/File collector reads a metrics file
    (kubeflow/katib pkg/metricscollector/v1beta1/file-metricscollector, parseLogsInTextFormat):
    lines split on "\\n" only; a line naming no metric is skipped; its timestamp is the text
    before the first space when it parses as RFC 3339 (else none); each match of the filter
    whose name is a metric is one observation."""
    found = []
    pattern = re.compile(KATIB_DEFAULT_FILTER, re.ASCII)
    for line in text.split("\n"):
        if not any(m in line for m in metrics):
            continue
        head = line.split(" ", 1)[0] if " " in line else None
        stamp = head if head is not None and RFC3339NANO.fullmatch(head) else None
        if stamp is not None:
            datetime.fromisoformat(stamp.replace("Z", "+00:00"))  # and it is a real time
        for match in pattern.finditer(line):
            name, value = match.group(1).strip(), match.group(2).strip()
            if name in metrics:
                found.append((stamp, name, float(value)))
    return found


def katib_wrapped(argv: list[str], log_dir: str) -> str:
    """The ``sh -c`` argument Katib's pod webhook makes of a StdOut-collected trial container
    (pkg/webhook/v1beta1/pod: the command and args joined by spaces, stdout and stderr to
    metrics.log, then the pid file; ``$$`` is what the pod's ``$$$$`` becomes)."""
    return f"{' '.join(argv)} 1>{log_dir}/metrics.log 2>&1 && echo completed > {log_dir}/$$.pid"


def trial_argv(python: str, params: str, data: str, out: str, epochs: int) -> list[str]:
    """A trial's command as the search builds it (the train step's CLI, ``--set`` args),
    its sampled value put in where Katib puts it (``${trialParameters.<name>}`` replaced by
    the parameter's value string)."""
    from components.kernel import step as kernel
    from components.ml.training import search_space

    space = search_space.parse_space(
        {"train.learning_rate": {"type": "float", "low": 0.001, "high": 0.01, "log": True}},
        source="test",
    )
    (parameter,) = search_space.katib_parameters(space)
    value = parameter["feasibleSpace"]["max"]
    sampled = [
        a.replace(f"${{trialParameters.{parameter['name']}}}", value)
        for a in search_space.katib_args(space)
    ]
    paths = {
        "data_dir": data,
        "out_dir": f"{out}/model",
        "checkpoint_dir": f"{out}/checkpoints",
        "metrics_file": f"{out}/metrics.json",
        "plots_file": f"{out}/curves.csv",
    }
    fixed = {"train.epochs": epochs, "train.reader_probe_samples": 0}
    fixed["task.options.conv_channels"] = [6, 16]
    return [
        python,
        "-m",
        "components",
        *kernel.load("train").argv(params, paths),
        *overrides.set_args(fixed),
        *sampled,
    ]


def check_katib_metrics(log_dir: Path, epochs: int) -> None:
    """metrics.log holds exactly one timestamped objective value per epoch, and the pid file
    says the trial completed."""
    text = (log_dir / "metrics.log").read_text()
    seen = katib_observations(text, ["val_accuracy"])
    assert len(seen) == epochs, text[-3000:]
    assert all(0.0 <= v <= 1.0 for _, _, v in seen)
    assert all(stamp is not None for stamp, _, _ in seen), (
        "metric lines without a timestamp Katib parses (the first token of the line):\n"
        + "\n".join(repr(line) for line in text.split("\n") if "val_accuracy=" in line)
    )
    (pid,) = log_dir.glob("*.pid")
    assert re.fullmatch(r"\d+\.pid", pid.name) and pid.read_text() == "completed\n"


def test_the_trial_command_wrapped_as_katib_does_prints_lines_its_collector_parses(
    tmp_path, digits_data
):
    epochs = 2
    argv = trial_argv(
        sys.executable, str(REPO / "params.yaml"), str(digits_data), str(tmp_path / "trial"), epochs
    )
    log_dir = tmp_path / "katib"
    log_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PADDLE_MLOPS_TRIAL": "1"}
    proc = subprocess.run(
        ["sh", "-c", katib_wrapped(argv, str(log_dir))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (log_dir / "metrics.log").read_text()[-3000:]
    assert proc.stdout == proc.stderr == ""  # all of it went to metrics.log
    check_katib_metrics(log_dir, epochs)
