"""One model-config schema for Python and C++: ``model_config.schema.json``
(components/ml/serving/model_config/).

Python validates a bundle's ``model_config.json`` against it
(``components.ml.serving.model_config``); the C++ server's defaults and minimums are generated from
it at build time. Here the real built server is driven with configs made from the schema: its
per-model settings (``--help`` marks them ``(model)``) and their defaults are the schema's, and
every value the schema accepts or refuses (each key's default and bounds, one past each bound, a
wrong type, a choice not offered, a key not in the schema) the server accepts or refuses too. A key
added on one side and not the other fails here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.core.artifacts import StepError
from components.core.config import load_params
from components.ml.serving import model_config as mc
from tests.conftest import REPO

# a value of another JSON type than the setting's, for each type
WRONG_TYPES: dict[str, list[Any]] = {
    "integer": ["1", 1.0, 1.5, True],
    "number": ["0.5", True],
    "boolean": [1, "true"],
    "string": [1, True],
}


def _cases() -> list[tuple[str, Any]]:
    """(key, value): each setting's default, its bounds and one past them, wrong types, a
    choice not offered; and a key that is no setting."""
    out: list[tuple[str, Any]] = [("max_batch", 8)]  # not a setting
    for key, spec in mc.SETTINGS.items():
        values: list[Any] = [spec["default"], *WRONG_TYPES[spec["type"]]]
        step = 1 if spec["type"] == "integer" else 0.5
        if "minimum" in spec:
            values += [spec["minimum"], spec["minimum"] - step]
        if "maximum" in spec:
            values += [spec["maximum"], spec["maximum"] + step]
        if spec["type"] == "number":
            values.append((spec["minimum"] + spec["maximum"]) / 2)
        if "enum" in spec:
            values += [*spec["enum"], "x" + spec["enum"][0]]
        out += [(key, v) for v in values]
    return out


def _schema_accepts(key: str, value: Any) -> bool:
    """Python's verdict on ``key: value`` (the other keys: their defaults)."""
    return mc.violation({**mc.DEFAULTS, key: value}) is None


def _server_verdict(binary: Path, model_dir: Path, doc: dict[str, Any]) -> tuple[bool, str]:
    """Whether the server takes ``doc`` as its model_config.json: it refuses a bad file with
    exit code 2 and a line naming the file and field, before anything else; a good one gets
    it past the settings, to loading the model (there is none: it stops there)."""
    model_dir.mkdir()
    (model_dir / "model_config.json").write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVING_")}
    proc = subprocess.run(
        [str(binary), f"--model-dir={model_dir}", "--port=0", "--grpc-port=-1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    refused = proc.returncode == 2 and "model_config.json: field '" in out
    loading = "cannot load model" in out and "model_config.json" not in out
    assert refused or loading, f"{doc}: neither refused nor past the settings: {out[-500:]}"
    return not refused, out


def test_python_writes_the_schemas_required_settings_and_params_yaml_follows_it():
    written = [f.name for f in dataclasses.fields(mc.ModelConfig)]
    assert sorted(written) == sorted(mc.SCHEMA["required"])
    assert set(mc.SCHEMA["required"]) <= set(mc.SETTINGS)
    for key, spec in mc.SETTINGS.items():
        assert mc.violation({**mc.DEFAULTS, key: spec["default"]}) is None, key
    for params in [REPO / "params.yaml", *sorted(REPO.glob("tasks/*/params.yaml"))]:
        section = load_params(params).get("package", {}).get("model_config")
        if section is not None:
            assert mc.violation(section) is None, params


def test_the_servers_per_model_settings_and_defaults_are_the_schemas(server_binary):
    usage = subprocess.run(
        [str(server_binary), "--help"], capture_output=True, text=True, check=True
    ).stdout
    found = dict(
        re.findall(r"^  --([a-z-]+) \(model\)  \[[^]]*\](?:  default: (\S+))?$", usage, re.M)
    )
    served = {name.replace("-", "_"): text for name, text in found.items()}
    assert sorted(served) == sorted(mc.SETTINGS), "per-model settings: server vs schema"
    parse = {
        "integer": int,
        "number": float,
        "boolean": lambda text: {"true": True, "false": False}[text],
        "string": str,
    }
    defaults = {k: parse[mc.SETTINGS[k]["type"]](text) for k, text in served.items()}
    assert defaults == mc.DEFAULTS


def test_the_server_accepts_and_refuses_what_the_schema_does(server_binary, tmp_path):
    disagree = []
    for i, (key, value) in enumerate(_cases()):
        accepted, out = _server_verdict(server_binary, tmp_path / str(i), {key: value})
        if accepted != _schema_accepts(key, value):
            rule = mc.violation({**mc.DEFAULTS, key: value})
            disagree.append(f"{key}={value!r}: server {accepted}, schema {rule}: {out[-200:]}")
    assert not disagree, "\n".join(disagree)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"max_batch_size": 0}, "field 'max_batch_size': must be >= 1, got 0"),
        ({"workers": "2"}, "field 'workers': must be int, got '2'"),
        ({"workers": 1.0}, "field 'workers': must be int, got 1.0"),
        ({"log_input_rate": 1.5}, "field 'log_input_rate': must be in [0, 1], got 1.5"),
        ({"precision": "fp16"}, "field 'precision': must be one of ['f32', 'bf16', 'auto']"),
        ({"max_batch": 8}, "field 'max_batch': not a per-model setting"),
    ],
)
def test_python_refuses_a_bad_file_naming_file_field_and_rule(tmp_path, doc, message):
    config = mc.ModelConfig(**{k: mc.DEFAULTS[k] for k in mc.SCHEMA["required"]})
    mc.write(tmp_path, config)
    path = tmp_path / "model_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **doc}))
    with pytest.raises(StepError) as err:
        mc.read(tmp_path)
    assert f"{path}: {message}" in str(err.value)


def test_python_reads_the_optional_server_settings_and_needs_every_written_one(tmp_path):
    config = mc.ModelConfig(**{k: mc.DEFAULTS[k] for k in mc.SCHEMA["required"]})
    path = mc.write(tmp_path, config)
    path.write_text(json.dumps({**config.to_json(), "precision": "bf16", "cpu_pinning": True}))
    assert mc.read(tmp_path) == config
    path.write_text(json.dumps({k: v for k, v in config.to_json().items() if k != "workers"}))
    with pytest.raises(StepError, match=r"missing field\(s\) \['workers'\]"):
        mc.read(tmp_path)
