"""The hpo libraries: the search space (validation, sampling, --set args, Katib parameters),
the trial metric lines, the Optuna engine with fake trial processes (pruning, a crash, the
fail share, the wall budget, a killed driver resumed) and the adoption rule.

Fake trials are ``tests/hpo_fake_trial.py``: a curve from ``--set=train.x=...``. No test waits
on the wall clock: the wall budget runs on an injected clock, the killed driver is killed once
the record file shows the trial that blocks until killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import optuna
import pytest
import yaml

from components.core import overrides as ov
from components.core.artifacts import StepError
from components.core.config import load_params
from components.core.retry import Clock
from components.ml.decisions.adoption import AdoptParams, baseline_won, decide
from components.ml.training import search_space as ss
from components.ml.training import trial_metrics as tm
from components.ml.training.search import (
    BudgetParams,
    PrunerParams,
    SamplerParams,
    counts,
    open_study,
    run_search,
)
from tests.conftest import REPO

FAKE = REPO / "tests" / "hpo_fake_trial.py"


def space_of(text: str) -> ss.Space:
    return ss.parse_space(yaml.safe_load(text), source="params.yaml")


# --------------------------------------------------------------------------- the space


def test_typo_is_one_line_with_the_closest_key():
    params = load_params(REPO / "params.yaml")
    space = space_of("train.lerning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}")
    with pytest.raises(StepError) as err:
        ss.validate(space, params, source="params.yaml")
    assert str(err.value) == (
        "params.yaml: hpo.space: train.lerning_rate: no such key "
        "(did you mean train.learning_rate?)"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("train.seed: {type: int, low: 0, high: 9}", "train.seed: the seed is not"),
        ("evaluate.batch_size: {type: int, low: 1, high: 3}", "only task.* and train.* keys"),
        ("train.learning_rate: {type: float, low: 0, high: 1, log: true}", "log: true needs low"),
        ("train.learning_rate: {type: float, low: 1, high: 0}", "low must be < high"),
        ("train.batch_size: {type: categorical, choices: [a b, c]}", "no spaces or shell"),
        ("train.batch_size: {type: categorical, choices: ['true']}", "reads back as True"),
        ("train.batch_size: {type: choice, choices: [1]}", "type must be one of"),
        ("train.batch_size: {type: int, low: 1, high: 4, stepp: 2}", "unknown field(s) ['stepp']"),
    ],
)
def test_refused_specs_are_one_line(spec, message):
    params = load_params(REPO / "params.yaml")
    with pytest.raises(StepError) as err:
        ss.validate(space_of(spec), params, source="params.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("params.yaml: hpo.space")


def test_distributed_keys_are_not_searched():
    params = load_params(REPO / "params.yaml")
    with pytest.raises(StepError, match="train.distributed.nproc: distributed settings"):
        ss.validate(
            space_of("train.distributed.nproc: {type: int, low: 1, high: 2}"),
            params,
            source="p.yaml",
        )


SENTIMENT_SPACE = """
task.options.pretrained: {type: categorical, choices: [null, ernie-3.0-medium-zh]}
task.options.model.hidden_size: {type: int, low: 64, high: 256, step: 64,
                                 when: {task.options.pretrained: null}}
train.learning_rate: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
"""


def test_conditional_key_is_sampled_only_on_its_branch():
    params = load_params(REPO / "tasks" / "sentiment" / "params.yaml")
    space = space_of(SENTIMENT_SPACE)
    ss.validate(space, params, source="tasks/sentiment/params.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    branches = set()
    for _ in range(30):
        sample = ss.suggest(study.ask(), space, params)
        on = sample["task.options.pretrained"] is None
        assert ("task.options.model.hidden_size" in sample) == on
        assert 1e-5 <= sample["train.learning_rate"] <= 1e-3
        branches.add(on)
    assert branches == {True, False}
    # a condition that can never hold, and one on a key listed later, are refused
    never = SENTIMENT_SPACE.replace(
        "when: {task.options.pretrained: null}", "when: {task.options.pretrained: other}"
    )
    with pytest.raises(StepError, match="when: task.options.pretrained: other never holds"):
        ss.validate(space_of(never), params, source="p.yaml")
    later = "\n".join(SENTIMENT_SPACE.strip().splitlines()[1:] + SENTIMENT_SPACE.splitlines()[1:2])
    with pytest.raises(StepError, match="must be listed before"):
        ss.validate(space_of(later), params, source="p.yaml")


def test_set_args_round_trip():
    sample = {
        "train.learning_rate": 1e-05,
        "train.batch_size": 64,
        "task.options.hidden": [256, 128],
        "task.options.pretrained": None,
        "train.amp": True,
        "task.options.name": "ernie-3.0-medium-zh",
    }
    args = ov.set_args(sample)
    assert (
        args[0] == "--set=train.learning_rate=1.0e-05"
        and args[2] == "--set=task.options.hidden=[256,128]"
    )
    assert not any(" " in a for a in args)
    assert dict(ov.parse_set(a) for a in args) == sample
    # apply puts each value at its dotted key of a copy
    params = {"train": {"learning_rate": 0.1, "batch_size": 8}, "task": {"options": {}}}
    merged = ov.apply(params, sample)
    assert merged["train"]["learning_rate"] == 1e-05 and params["train"]["learning_rate"] == 0.1


def test_katib_parameters_and_args():
    space = space_of(
        SENTIMENT_SPACE
        + "train.batch_size: {type: int, low: 8, high: 256, log: true}\n"
        + "task.options.hidden: {type: categorical, choices: [[120, 84], [256, 128]]}\n"
    )
    params = ss.katib_parameters(space)
    by = {p["name"]: p for p in params}
    assert by["train-learning_rate"] == {
        "name": "train-learning_rate",
        "parameterType": "double",
        "feasibleSpace": {"min": "1.0e-05", "max": "0.001", "distribution": "logUniform"},
    }
    assert by["task-options-model-hidden_size"]["parameterType"] == "int"  # flattened
    assert by["task-options-model-hidden_size"]["feasibleSpace"] == {
        "min": "64",
        "max": "256",
        "step": "64",
    }
    batch = by["train-batch_size"]
    assert batch["parameterType"] == "discrete"  # int + log: never hyperopt's float loguniform
    points = [int(v) for v in batch["feasibleSpace"]["list"]]
    assert points[0] == 8 and points[-1] == 256 and points == sorted(set(points))
    assert by["task-options-hidden"]["feasibleSpace"] == {"list": ["[120,84]", "[256,128]"]}
    assert by["task-options-pretrained"]["feasibleSpace"] == {
        "list": ["null", "ernie-3.0-medium-zh"]
    }
    # every value is a string, as Katib's ParameterSpec takes them
    for p in params:
        assert set(p) == {"name", "parameterType", "feasibleSpace"}
        for value in p["feasibleSpace"].values():
            assert isinstance(value, str) or all(isinstance(v, str) for v in value)
    assert ss.katib_keys(space)["train-learning_rate"] == "train.learning_rate"
    assert list(ss.katib_keys(space).values()) == list(space)
    trial = ss.katib_trial_parameters(space)
    assert [t["name"] for t in trial] == [p["name"] for p in params]
    assert all(t["reference"] == t["name"] for t in trial)
    args = ss.katib_args(space)
    assert "--set=train.learning_rate=${trialParameters.train-learning_rate}" in args
    assert (
        "--set-if=task.options.pretrained=null:"
        "task.options.model.hidden_size=${trialParameters.task-options-model-hidden_size}"
    ) in args
    used = {m for a in args for m in re.findall(r"\$\{trialParameters\.(.+?)\}", a)}
    assert used == {t["name"] for t in trial}


# --------------------------------------------------------------------------- metric lines


def test_metric_line_parses_back_and_katib_filter_reads_it():
    now = datetime(2026, 12, 6, 9, 10, 0, 123456, tzinfo=UTC)
    metrics = {"val_accuracy": 0.912345678, "val_loss": 1.5e-7, "val_nan": float("nan")}
    line = tm.metric_line(3, metrics, now)
    assert line == "2026-12-06T09:10:00.123456Z epoch=3 val_accuracy=0.912346 val_loss=1.5e-07"
    assert tm.parse(["noise val_accuracy", line, "epoch=x"], ["val_accuracy", "val_loss"]) == [
        (3, {"val_accuracy": 0.912346, "val_loss": 1.5e-07})
    ]
    # Katib's collector: the first token is an RFC3339 timestamp, then its default filter's matches
    stamp, _, rest = line.partition(" ")
    assert datetime.fromisoformat(stamp) == now
    katib = re.compile(r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)", re.ASCII)
    assert tm.KATIB_DEFAULT_FILTER == katib.pattern
    found = {m.group(1): float(m.group(2)) for m in katib.finditer(line)}
    assert found == {"epoch": 3.0, "val_accuracy": 0.912346, "val_loss": 1.5e-07}
    with pytest.raises(ValueError, match="metric name"):
        tm.metric_line(1, {"val acc": 1.0}, now)


# --------------------------------------------------------------------------- the engine

BASE = {"train": {"x": 0.9, "epochs": 4}, "task": {}}
SPACE_X = "train.x: {type: float, low: 0.0, high: 1.0}"


def fake_argv(number: int, sample: dict) -> list[str]:
    return [sys.executable, str(FAKE), *ov.set_args({"train.epochs": 4, **sample})]


def fake_env(record: Path, **extra: str) -> dict[str, str]:
    record.touch()
    return {"FAKE_RECORD": str(record), "PYTHONPATH": str(REPO), **extra}


def events(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def search(tmp_path: Path, space: str, *, trials: int, enqueue=(), base=BASE, **kw):
    record = tmp_path / "record.jsonl"
    return run_search(
        tmp_path / "study",
        "hpo-test",
        space_of(space),
        base,
        "val_score",
        "maximize",
        fake_argv,
        budget=kw.pop("budget", BudgetParams(trials=trials, max_fail_fraction=0.5)),
        sampler=SamplerParams(name="random", seed=0),
        pruner=kw.pop("pruner", PrunerParams(name="none")),
        env=fake_env(record),
        enqueue=[{"train.x": x} for x in enqueue],
        **kw,
    ), events(record)


def test_pruner_stops_a_bad_curve(tmp_path):
    median = PrunerParams(name="median", n_startup_trials=3, n_warmup_steps=1)
    result, log = search(tmp_path, SPACE_X, trials=4, enqueue=[0.8, 0.7, 0.01], pruner=median)
    states = [(t.number, t.params["train.x"], t.state) for t in result.trials]
    assert states == [
        (0, 0.9, "COMPLETE"),
        (1, 0.8, "COMPLETE"),
        (2, 0.7, "COMPLETE"),
        (3, 0.01, "PRUNED"),
    ]
    assert result.best is not None and result.best.number == 0 and result.best.value == 0.9
    assert [e for e, _ in result.trials[0].curve] == [0, 1, 2, 3]
    starts = [e for e in log if e["event"] == "start"]
    assert all(e["trial"] == "1" for e in starts)  # PADDLE_MLOPS_TRIAL=1
    bad = starts[3]["pid"]
    epochs = [e["epoch"] for e in log if e["event"] == "epoch" and e["pid"] == bad]
    assert epochs == [0, 1]  # killed while blocked after epoch 1 of 4: SIGTERM reached it
    assert not any(e["event"] == "end" and e["pid"] == bad for e in log)


def test_crashed_trial_is_recorded_and_the_search_goes_on(tmp_path):
    result, log = search(tmp_path, SPACE_X, trials=3, enqueue=[0.97, 0.6])
    assert [t.state for t in result.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    error = result.trials[1].error
    assert error.startswith("exit 1: ") and "boom: x=0.97 is flagged" in error
    assert result.to_json()["trials"][1]["error"] == error


def test_fail_share_past_the_limit_is_one_error(tmp_path):
    with pytest.raises(StepError) as err:
        search(tmp_path, SPACE_X, trials=6, enqueue=[0.97, 0.98, 0.5])
    assert str(err.value).startswith(
        "hpo: 2 of 3 trials failed (67% > hpo.budget.max_fail_fraction 0.5); "
        "last: trial 2 exit 1: boom: x=0.98 is flagged"
    )
    starts = [e for e in events(tmp_path / "record.jsonl") if e["event"] == "start"]
    assert len(starts) == 3  # stopped at once


def test_wall_budget_on_an_injected_clock(tmp_path):
    now = [0.0]
    clock = Clock(monotonic=lambda: now[0], sleep=lambda s: None)

    def tick(trial):  # each finished trial "takes" 100 s
        now[0] += 100

    budget = BudgetParams(trials=10, wall_s=250)
    result, _ = search(tmp_path, SPACE_X, trials=10, budget=budget, clock=clock, after_trial=tick)
    assert len(result.finished()) == 3  # 100, 200, 300 >= 250: no fourth
    # a second driver run counts the 300 s already spent
    result, _ = search(tmp_path, SPACE_X, trials=10, budget=budget, clock=clock, after_trial=tick)
    assert len(result.finished()) == 3


def test_trial_running_past_the_wall_budget_is_stopped(tmp_path):
    record = tmp_path / "record.jsonl"

    def now() -> float:  # time "passes" once the blocking trial has printed its epoch 1
        lines = events(record) if record.exists() else []
        return 1000.0 if any(e.get("epoch") == 1 for e in lines) else 0.0

    base = {"train": {"x": 0.01, "epochs": 4}, "task": {}}
    result, log = search(
        tmp_path,
        SPACE_X,
        trials=3,
        base=base,
        clock=Clock(monotonic=now),
        budget=BudgetParams(trials=3, wall_s=100),
    )
    assert [(t.state, t.error) for t in result.trials] == [
        ("FAIL", "timeout: past the wall budget 100s")
    ]
    assert [e["event"] for e in log] == ["start", "epoch", "epoch"]  # stopped while blocked


def test_parallel_trials_fill_the_budget(tmp_path):
    budget = BudgetParams(trials=5, parallel=2)
    result, log = search(
        tmp_path, "train.x: {type: float, low: 0.3, high: 0.9}", trials=5, budget=budget
    )
    assert [t.state for t in result.trials] == ["COMPLETE"] * 5
    assert sum(e["event"] == "start" for e in log) == 5


DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.test_hpo_search import search
search(Path({tmp!r}), "train.x: {{type: float, low: 0.3, high: 0.9}}", trials=6)
"""


def test_killed_driver_resumes_without_repeating_finished_trials(tmp_path):
    record = tmp_path / "record.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_HANG_AFTER": "3"}
    code = DRIVER.format(repo=str(REPO), tmp=str(tmp_path))
    driver = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    starts: list[dict] = []
    for _ in range(1200):  # waits for an event (the 4th start), whatever the host's speed
        starts = [e for e in events(record) if e["event"] == "start"] if record.exists() else []
        if len(starts) >= 4 or driver.poll() is not None:
            break
        time.sleep(0.1)
    assert len(starts) == 4, driver.stderr.read() if driver.poll() is not None else "timeout"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    os.kill(starts[3]["pid"], signal.SIGKILL)  # the blocked trial: its own session
    driver.stderr.close()

    study = open_study(tmp_path / "study", "hpo-test", "maximize", SamplerParams(), PrunerParams())
    before = {t.number: (t.state.name, t.params) for t in study.get_trials()}
    assert [before[n][0] for n in range(4)] == ["COMPLETE"] * 3 + ["RUNNING"]
    assert counts(study) == (3, 0)

    result, log = search(tmp_path, "train.x: {type: float, low: 0.3, high: 0.9}", trials=6)
    by = {t.number: t for t in result.trials}
    for n in range(3):  # finished trials unchanged
        assert (by[n].state, {"train.x": by[n].params["train.x"]}) == (before[n][0], before[n][1])
    assert by[3].state == "FAIL" and by[3].stale
    retry = [t for t in result.trials if t.retry_of == 3]
    assert len(retry) == 1 and retry[0].params == by[3].params and retry[0].state == "COMPLETE"
    assert len(result.finished()) == 6 and len(result.trials) == 7
    launched = [json.dumps(e["params"]["train.x"]) for e in log if e["event"] == "start"]
    assert len(launched) == 7  # 4 before the kill + 3 after it
    again = {x for x in launched if launched.count(x) > 1}
    assert again == {json.dumps(by[3].params["train.x"])}  # only the stale one ran twice


# --------------------------------------------------------------------------- adoption

LIMITS = AdoptParams(seeds=3, alpha=0.05, min_gain=0.0)


@pytest.mark.parametrize(
    ("current", "winner", "higher", "adopted", "reason"),
    [
        # consistent gain: adopted
        ([0.90, 0.91, 0.92], [0.94, 0.95, 0.97], True, True, "hpo: adopted trial 7: val_x +0.0433"),
        # one seed worse: kept, whatever the mean
        ([0.90, 0.91, 0.92], [0.99, 0.99, 0.91], True, False, "not better on seed(s) 2"),
        # every seed better but noisy and small: the lower bound is <= 0
        ([0.90, 0.91, 0.92], [0.901, 0.95, 0.921], True, False, "lower bound -0.0"),
        # sd = 0, every d > 0: the bound is the mean
        ([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], True, True, "lower bound 0.5 > 0"),
        # lower is better (FID): a drop is a gain
        ([30.0, 31.0, 29.0], [25.0, 26.0, 24.5], False, True, "val_x +4.83 mean"),
        ([30.0, 31.0, 29.0], [35.0, 36.0, 34.5], False, False, "not better on seed(s) 0, 1, 2"),
    ],
)
def test_adoption_rule(current, winner, higher, adopted, reason):
    decision = decide(
        current,
        winner,
        seeds=[0, 1, 2],
        higher_is_better=higher,
        limits=LIMITS,
        metric="val_x",
        trial=7,
    )
    assert decision.adopted is adopted
    assert reason in decision.reason and "\n" not in decision.reason
    assert decision.reason.startswith("hpo: adopted" if adopted else "hpo: kept current params")
    assert decision.evidence()["seeds"] == [0, 1, 2] and len(decision.evidence()["diffs"]) == 3


def test_adoption_min_gain_and_baseline():
    small = decide(
        [0.90, 0.91, 0.92],
        [0.91, 0.92, 0.93],
        seeds=[5, 6, 7],
        higher_is_better=True,
        limits=AdoptParams(min_gain=0.02),
        metric="val_accuracy",
        trial=3,
    )
    assert not small.adopted and small.reason.endswith("<= 0.02 (3 seeds)")
    # t(0.95, 2) = 2.920, as docs/hpo.md says
    assert "t = 2.920" in small.rule
    kept = baseline_won(0, "val_accuracy")
    assert not kept.adopted and "the best trial 0 is the current params" in kept.reason
    with pytest.raises(ValueError, match="paired"):
        decide([1.0], [2.0], seeds=[0], higher_is_better=True, limits=LIMITS, metric="m", trial=1)
