"""Params overlays: a task pipeline's params file holds only what differs from params.yaml,
and every pipeline's effective params (what each step receives) stay what they were when the
task files were full copies."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import yaml

from components.core.artifacts import StepError
from components.core.config import EXTENDS, REPLACE, load_params, section
from components.kernel.dvc import task_pipelines
from components.kernel.step import all_steps, load
from tests.conftest import REPO

# sha256 of the typed params every step of each pipeline receives, taken when the task files
# were full copies (commit 00c3e19: 4cc40a6d, 8e101d5b, 75e10d26). A deliberate change of a
# setting updates its line here. Since: serving_image.server moved to package.model_config
# (the bundle's model_config.json), same values, plus dynamic_batching, max_queue_size and
# request_timeout_ms written out at the server's own defaults (true, 4096, 10000). Then:
# package.tune added (the serving-config search); serving_image.server_binary removed (the
# binary is $PADDLE_MLOPS_SERVER_BINARY or the dev build, for every step that runs it).
# hpo.katib added (engine katib: the Experiment, its trials, the shared volume, the wait).
# train.max_steps_per_epoch and train.max_val_steps added (null: the whole split);
# evaluate.max_samples (0: all) replaced by evaluate.max_steps (null: all). train.cache_mb
# added (1024: preprocessed pieces kept on disk; the values trained on are unchanged).
EFFECTIVE = {
    "params.yaml": "f9cd9210",
    "tasks/digits_gan/params.yaml": "9f6dff4c",
    "tasks/sentiment/params.yaml": "b921075e",
}


def effective_digest(params_file: str) -> str:
    """Digest of the ``task`` section and of each step's typed sections (the dataclasses its
    ``run`` receives), as :meth:`Step.call` builds them."""
    from components.tasks import task_from_params

    params = load_params(REPO / params_file)
    task = task_from_params(params)
    typed = {"task": json.dumps(params["task"], sort_keys=True)}
    for step in all_steps():
        if step.params is not None:
            cls = step.params_of_task(task) if step.params_of_task else step.params
            typed[step.name] = repr(section(dict(params), step.name, cls))
        for name, _, cls in step.shared:
            typed[f"{step.name}/{name}"] = repr(section(dict(params), name, cls))
    return hashlib.sha256(json.dumps(typed, sort_keys=True).encode()).hexdigest()[:8]


@pytest.mark.parametrize("params_file", sorted(EFFECTIVE))
def test_effective_params_of_each_pipeline_are_unchanged(params_file):
    assert effective_digest(params_file) == EFFECTIVE[params_file], (
        f"{params_file}: the params its steps receive changed; if on purpose, update EFFECTIVE"
    )


def test_every_task_pipeline_is_pinned():
    assert set(task_pipelines()) == set(EFFECTIVE) - {"params.yaml"}


def _leaves(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("params_file", task_pipelines())
def test_a_task_overlay_holds_only_what_differs(params_file):
    overlay = yaml.safe_load((REPO / params_file).read_text())
    assert overlay[EXTENDS] == "../../params.yaml"
    base = _leaves(yaml.safe_load((REPO / "params.yaml").read_text()))
    replaced = tuple(f"{k}." for k in overlay.get(REPLACE, []))
    copies = [
        k
        for k, v in _leaves(
            {k: v for k, v in overlay.items() if k not in (EXTENDS, REPLACE)}
        ).items()
        if k in base and base[k] == v and not k.startswith(replaced)
    ]
    assert not copies, f"{params_file} repeats params.yaml's values of {copies}"


def test_overlay_merges_mappings_and_replaces_what_it_lists(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "train: {epochs: 5, lr: 0.1, sched: {step: 2, gamma: 0.5}}\n"
        "task: {name: a, options: {x: 1, y: 2}}\n"
    )
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "p.yaml").write_text(
        "extends: ../base.yaml\nreplace: [task.options]\n"
        "train: {epochs: 9, sched: {gamma: 0.1}}\ntask: {name: b, options: {z: 3}}\n"
    )
    params = load_params(sub / "p.yaml")
    assert params["train"] == {"epochs": 9, "lr": 0.1, "sched": {"step": 2, "gamma": 0.1}}
    assert params["task"] == {"name": "b", "options": {"z": 3}}
    assert params.source == str(sub / "p.yaml")


def test_overlay_errors_name_the_file(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(StepError, match=r"b.yaml: extends: a.yaml extends it again"):
        load_params(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(StepError, match=r"missing.yaml: params file not found"):
        load_params(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("extends: c.yaml\nreplace: task.options\n")
    (tmp_path / "c.yaml").write_text("task: {}\n")
    with pytest.raises(StepError, match=r"d.yaml: replace: expected a list of dotted keys"):
        load_params(tmp_path / "d.yaml")


# --------------------------------------------------------------------------- the schema


def test_the_committed_schema_is_the_generated_one():
    """``params.schema.json`` is what ``paddle-mlops params schema`` writes from the params
    models: a model changed without regenerating it fails here."""
    from components.kernel.params_schema import SCHEMA_FILE, schema_text

    assert (REPO / SCHEMA_FILE).read_text() == schema_text(), (
        f"{SCHEMA_FILE} is stale: run `paddle-mlops params schema` and commit it"
    )


@pytest.mark.parametrize("params_file", ["params.yaml", *task_pipelines()])
def test_every_params_file_names_the_schema_and_is_valid_under_it(params_file):
    import os

    import jsonschema

    from components.kernel.params_schema import SCHEMA_FILE

    path = REPO / params_file
    first = path.read_text().splitlines()[0]
    relative = os.path.relpath(REPO / SCHEMA_FILE, path.parent)
    assert first == f"# yaml-language-server: $schema={relative}"
    schema = json.loads((REPO / SCHEMA_FILE).read_text())
    errors = list(
        jsonschema.Draft202012Validator(schema).iter_errors(yaml.safe_load(path.read_text()))
    )
    assert not errors, [e.message for e in errors]


def test_the_schema_refuses_what_the_loader_refuses():
    import jsonschema

    from components.kernel.params_schema import schema

    validator = jsonschema.Draft202012Validator(schema())
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert not list(validator.iter_errors(params))
    for dotted, value in [
        ("train.lerning_rate", 0.1),  # unknown
        ("train.epochs", 0),  # below its range
        ("train.amp", "O3"),  # not one of the choices
        ("deploy.local_port", "8501"),  # a string for a number
    ]:
        section, key = dotted.split(".")
        bad = {**params, section: {**params[section], key: value}}
        assert list(validator.iter_errors(bad)), dotted


def test_a_typo_is_one_line_naming_the_file_the_field_and_the_closest_name(tmp_path):
    path = tmp_path / "params.yaml"
    text = (REPO / "params.yaml").read_text().replace("  learning_rate:", "  lerning_rate:", 1)
    path.write_text(text)
    with pytest.raises(StepError) as info:
        section(load_params(path), "train", load("train").params)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        f"{path}: train: unknown field(s) ['lerning_rate']; did you mean 'learning_rate'?"
    )


def test_a_bad_value_is_one_line_naming_the_dotted_field_and_the_rule(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  distributed: {nproc: 0}\n  epochs: 3\n")
    with pytest.raises(StepError) as info:
        section(load_params(path), "train", load("train").params)
    assert str(info.value) == f"{path}: train.distributed.nproc: must be >= 1, got 0"
    path.write_text("train:\n  distributed: {nproc: '2'}\n")
    with pytest.raises(StepError) as info:
        section(load_params(path), "train", load("train").params)
    assert str(info.value) == f"{path}: train.distributed.nproc: expected an integer, got '2'"
    # KFP's protobuf Struct makes every number a float: a whole one is an integer
    params = section({"train": {"epochs": 3.0}}, "train", load("train").params)
    assert params.epochs == 3 and isinstance(params.epochs, int)


def test_params_command_writes_the_schema(tmp_path):
    from components.kernel.cli import main
    from components.kernel.params_schema import schema_text

    out = tmp_path / "schema.json"
    assert main(["params", "schema", "--out", str(out)]) == 0
    assert out.read_text() == schema_text()


@dataclasses.dataclass(frozen=True)
class PlugInInner:
    k: float = 1.0


@dataclasses.dataclass(frozen=True)
class PlugInOptions:
    """A task plug-in's options as written before the params models."""

    width: int = 3
    inner: PlugInInner = dataclasses.field(default_factory=PlugInInner)

    def check(self) -> None:
        if self.width > 10:
            raise ValueError("width must be <= 10")


def test_a_plug_ins_plain_dataclass_still_loads_with_the_same_rules():
    """A task plug-in written before the params models (a plain frozen dataclass, its own
    ``check()``) loads; unknown fields, wrong types and its own rule are one line each."""
    from components.core.artifacts import StepError
    from components.core.config import section

    built = section({"opts": {"width": 5, "inner": {"k": 2}}}, "opts", PlugInOptions)
    assert (
        built == PlugInOptions(width=5, inner=PlugInInner(k=2.0)) and type(built) is PlugInOptions
    )
    for bad, said in (
        ({"widht": 5}, "params.yaml: opts: unknown field(s) ['widht']; did you mean 'width'?"),
        ({"width": "5"}, "params.yaml: opts.width: expected an integer, got '5'"),
        ({"width": 50}, "params.yaml: opts: width must be <= 10"),
        (
            {"inner": {"kk": 1}},
            "params.yaml: opts.inner: unknown field(s) ['kk']; did you mean 'k'?",
        ),
    ):
        with pytest.raises(StepError) as caught:
            section({"opts": bad}, "opts", PlugInOptions)
        assert str(caught.value) == said
