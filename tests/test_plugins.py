"""Tasks as plugins: a task from a separately installed package (an entry point of group
``paddle_mlops.tasks``) runs through the unchanged steps, as a built-in task does; a plugin
that takes a built-in task's name is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from components.core.artifacts import read_json
from tests.conftest import REPO, pip_install_target, run_module

PLUGIN = '''
"""A task shipped outside paddle-mlops: digits with a wider first convolution by default."""

from dataclasses import replace

from components.tasks.digits import DigitsOptions, DigitsTask


class WideDigitsTask(DigitsTask):
    name = "wide_digits"

    @classmethod
    def from_options(cls, options, *, where="params.yaml: task.options"):
        task = super().from_options(options, where=where)
        if "conv_channels" not in options:
            task.options = replace(task.options, conv_channels=[12, 16])
        return cls(task.options)
'''


def install_plugin(root: Path, entry_name: str) -> Path:
    """Build and install (pip, no network) a package declaring ``entry_name`` as a task;
    the directory to put on PYTHONPATH."""
    src = root / "src"
    src.mkdir(parents=True)
    (src / "wide_digits.py").write_text(PLUGIN)
    (root / "pyproject.toml").write_text(
        "[build-system]\n"
        'requires = ["setuptools>=61"]\n'
        'build-backend = "setuptools.build_meta"\n'
        "[project]\n"
        'name = "wide-digits-task"\n'
        'version = "0.1"\n'
        '[project.entry-points."paddle_mlops.tasks"]\n'
        f'{entry_name} = "wide_digits:WideDigitsTask"\n'
        "[tool.setuptools]\n"
        'py-modules = ["wide_digits"]\n'
        'package-dir = {"" = "src"}\n'
    )
    return pip_install_target(root, root / "site")


def test_a_task_from_an_installed_package_runs_through_the_unchanged_steps(tmp_path, digits_data):
    site = install_plugin(tmp_path / "plugin", "wide_digits")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["task"] = {"name": "wide_digits", "options": {"hidden": [32]}}
    params["train"].update(epochs=1, batch_size=64)
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    env = {"PYTHONPATH": f"{site}:{REPO}"}
    proc = run_module(
        "components", "train", "--params", str(params_file), "--data", str(digits_data),
        "--model", str(tmp_path / "train"), "--checkpoints", str(tmp_path / "ckpt"),
        "--metrics", str(tmp_path / "train.json"), "--plots", str(tmp_path / "train.csv"),
        env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the plugin's model was trained: its default first convolution is 12 wide
    import paddle

    weights = paddle.load(str(tmp_path / "train" / "model.pdparams"))
    assert list(weights["features.0.weight"].shape) == [12, 1, 3, 3]
    assert read_json(tmp_path / "train.json")["epochs_run"] == 1
    # and it is listed beside the built-in tasks
    listed = subprocess.run(
        [sys.executable, "-c", "from components.tasks import available_tasks as a; print(a())"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert "'wide_digits'" in listed.stdout and "'digits'" in listed.stdout, listed.stderr


def test_a_plugin_that_takes_a_built_in_name_is_refused_in_one_line(tmp_path, digits_data):
    site = install_plugin(tmp_path / "plugin", "digits")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    proc = run_module(
        "components", "train", "--params", str(params_file), "--data", str(digits_data),
        "--model", str(tmp_path / "train"), "--checkpoints", str(tmp_path / "ckpt"),
        "--metrics", str(tmp_path / "train.json"), "--plots", str(tmp_path / "train.csv"),
        env={"PYTHONPATH": f"{site}:{REPO}"},
    )  # fmt: skip
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "task 'digits': entry point 'wide_digits:WideDigitsTask'" in last, last
    assert "wide-digits-task" in last and "rename one of them" in last, last
    assert not (tmp_path / "train").exists()


def test_built_in_tasks_register_under_the_kind_auth_assumes_without_importing_them():
    """``paddle-mlops mlflow-users`` names a built-in task's model without importing it (no
    paddle): that shortcut holds only while every built-in task keeps the default kind."""
    from components.tasks import available_tasks, get_task, is_builtin
    from components.tracking.registry import BUILTIN_MODEL_KIND

    builtin = [name for name in available_tasks() if is_builtin(name)]
    assert {"digits", "digits_gan", "image_folder", "sentiment"} <= set(builtin)
    assert {name: get_task(name).model_kind for name in builtin} == dict.fromkeys(
        builtin, BUILTIN_MODEL_KIND
    )
