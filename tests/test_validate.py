"""validate: a real Great Expectations run on good and deliberately broken data sets."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from components import dataset
from components.artifacts import StepError
from components.config import load_params, section
from components.ingest import IngestParams
from components.ingest import run as ingest_run
from components.tasks import get_task
from components.tasks.image_data import ValidateParams
from components.validate import ValidateResult
from components.validate import run as validate_run

REPO = Path(__file__).resolve().parents[1]

DIGITS = get_task("digits")


def ingest(params: IngestParams, out: Path) -> object:
    return ingest_run(params, DIGITS, out)


def run(params: ValidateParams, data_dir: Path, out_dir: Path) -> ValidateResult:
    return validate_run(params, DIGITS, data_dir, out_dir)


@pytest.fixture(scope="module")
def good_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ingest") / "data"
    ingest(IngestParams(source="builtin:digits", kind="builtin"), out)
    return out


@pytest.fixture()
def data(good_data: Path, tmp_path: Path) -> Path:
    """A private copy of the good data set to corrupt."""
    copy = tmp_path / "data"
    shutil.copytree(good_data, copy)
    return copy


def _fails(data_dir: Path, out_dir: Path, params: ValidateParams | None = None) -> str:
    with pytest.raises(StepError) as info:
        run(params or ValidateParams(), data_dir, out_dir)
    message = str(info.value)
    # the outputs are written even though the data failed
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["success"] is False and summary["failed"] >= 1
    # a header naming the counts, then one line per broken rule naming file(s) and column
    header, *lines = message.splitlines()
    assert header.startswith(
        f"data validation failed ({summary['failed']} of {summary['evaluated']} expectations"
    ), header
    assert lines, message
    for line in lines:
        assert re.match(r"  - [\w.]+(, [\w.]+)*: (column '\w+'|table): \S", line), line
    assert summary["failures"] and all(f in message for f in summary["failures"])
    assert (out_dir / "result.json").is_file()
    assert (out_dir / "data_docs" / "index.html").is_file()
    assert (out_dir / "manifest.json").is_file()
    return message


def test_good_data_passes(good_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "validate"
    result = run(ValidateParams(), good_data, out)
    assert result.evaluated > 20
    summary = json.loads((out / "summary.json").read_text())
    assert summary == {**summary, "success": True, "failed": 0, "failures": []}
    assert summary["evaluated"] == result.evaluated
    ge_result = json.loads((out / "result.json").read_text())
    assert ge_result["success"] is True
    assert {
        r["meta"]["active_batch_definition"]["data_asset_name"]
        for r in ge_result["validation_results"]
    } >= {"train.npz", "val.npz", "test.npz"}
    assert "train.npz" in (out / "data_docs" / "index.html").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["inputs"]) == {"train.npz", "val.npz", "test.npz", "labels.json"}
    assert {"result.json", "summary.json", "data_docs"} <= set(manifest["outputs"])
    assert not list(tmp_path.glob(".validate.*"))  # no temporary left behind


def test_good_data_has_no_duplicate_rows(good_data: Path, tmp_path: Path) -> None:
    """The real digits pass the duplicate bound: no split repeats a row (measured: 0)."""
    out = tmp_path / "validate"
    run(ValidateParams(max_duplicate_fraction=0.0), good_data, out)
    summary = json.loads((out / "summary.json").read_text())
    rows = {f"{s}.npz": len(dataset.read_split(good_data, s)) for s in dataset.SPLITS}
    assert summary["duplicates"] == {
        name: {"rows": n, "duplicate_rows": 0, "duplicate_fraction": 0.0}
        for name, n in rows.items()
    }


def test_duplicate_rows_within_a_split(data: Path, tmp_path: Path) -> None:
    """60% of train's rows are copies of other train rows (same image and label)."""
    split = dataset.read_split(data, "train")
    n = len(split)
    keep = int(n * 0.4)
    source = np.arange(n) % keep  # rows >= keep copy an earlier row
    dataset.write_split(data, "train", dataset.Split(split.images[source], split.labels[source]))
    message = _fails(data, tmp_path / "out")
    copies = n - keep
    assert (
        "train.npz: column 'duplicate_fraction': at most 0.05 of a split's rows may be exact "
        f"duplicates (same image bytes and label) of another row; found {copies} of {n} rows "
        f"({copies / n:.3f})" in message
    )
    assert "val.npz" not in message and "test.npz" not in message
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["duplicates"]["train.npz"] == {
        "rows": n,
        "duplicate_rows": copies,
        "duplicate_fraction": pytest.approx(copies / n),
    }
    # the same image under another label is not a duplicate row
    labels = split.labels[source] + np.arange(n) // keep  # copy k of a row: label + k
    dataset.write_split(data, "train", dataset.Split(split.images[source], labels % 10))
    assert run(ValidateParams(), data, tmp_path / "out2").evaluated > 20
    summary = json.loads((tmp_path / "out2" / "summary.json").read_text())
    assert summary["duplicates"]["train.npz"]["duplicate_rows"] == 0


def test_explicit_image_shape_passes(good_data: Path, tmp_path: Path) -> None:
    assert run(ValidateParams(image_shape=[8, 8, 1]), good_data, tmp_path / "v").evaluated > 20


def test_wrong_label(data: Path, tmp_path: Path) -> None:
    split = dataset.read_split(data, "train")
    labels = split.labels.copy()
    labels[3] = 42
    dataset.write_split(data, "train", dataset.Split(split.images, labels))
    message = _fails(data, tmp_path / "out")
    assert (
        "train.npz: column 'label': values must be in {0..9}; found 1 unexpected "
        "(e.g. 42 at index 3)" in message
    )
    assert "val.npz" not in message


def test_out_of_range_pixels(data: Path, tmp_path: Path) -> None:
    split = dataset.read_split(data, "val")
    images = split.images.astype(np.int16)
    images[5, 0, 0, 0] = 300
    dataset.write_split(data, "val", dataset.Split(images, split.labels))
    message = _fails(data, tmp_path / "out")
    assert (
        "val.npz: column 'pixel_max': values must be within [0, 255]; found 1 unexpected "
        "(e.g. 300 at index 5)" in message
    )
    assert "val.npz: column 'dtype': values must be in {'uint8'}" in message
    assert f"found {len(split)} unexpected (e.g. 'int16' at indices 0, 1, 2, ...)" in message


def test_missing_class(data: Path, tmp_path: Path) -> None:
    split = dataset.read_split(data, "val")
    keep = split.labels != 7
    dataset.write_split(data, "val", dataset.Split(split.images[keep], split.labels[keep]))
    message = _fails(data, tmp_path / "out")
    assert "val.npz: column 'label': every class must appear; missing {7}" in message
    assert "train.npz" not in message and "test.npz" not in message


def test_leak_between_splits(data: Path, tmp_path: Path) -> None:
    train, test = dataset.read_split(data, "train"), dataset.read_split(data, "test")
    leaked = dataset.Split(
        np.concatenate([train.images, test.images[:5]]),
        np.concatenate([train.labels, test.labels[:5]]),
    )
    dataset.write_split(data, "train", leaked)
    message = _fails(data, tmp_path / "out")
    n = len(train)
    assert (
        "test.npz, train.npz: column 'sample_sha': a sample may appear in only one split; "
        "found 10 rows whose sample is in another split" in message
    )
    pairs = re.findall(r"test\.npz\[(\d+)\] == train\.npz\[(\d+)\]", message)
    assert pairs and all(int(t) + n == int(r) for t, r in pairs)


def test_wrong_image_shape(data: Path, tmp_path: Path) -> None:
    split = dataset.read_split(data, "test")
    padded = np.pad(split.images, ((0, 0), (0, 1), (0, 0), (0, 0)))
    dataset.write_split(data, "test", dataset.Split(padded, split.labels))
    message = _fails(data, tmp_path / "out")
    assert (
        f"test.npz: column 'height': values must be in {{8}}; found {len(split)} unexpected "
        "(e.g. 9 at indices 0, 1, 2, ...)" in message
    )
    # against a configured shape every split is wrong
    message = _fails(data, tmp_path / "out2", ValidateParams(image_shape=[28, 28, 1]))
    for name in ("train.npz", "val.npz"):
        assert f"{name}: column 'width': values must be in {{28}}" in message


def test_class_imbalance(data: Path, tmp_path: Path) -> None:
    split = dataset.read_split(data, "train")
    keep = np.zeros(len(split), dtype=bool)
    for label in range(10):
        idx = np.flatnonzero(split.labels == label)
        keep[idx if label == 0 else idx[:10]] = True
    dataset.write_split(data, "train", dataset.Split(split.images[keep], split.labels[keep]))
    message = _fails(data, tmp_path / "out")
    assert (
        "train.npz: column 'fraction': each class must make up a fraction within [0.02, 0.5] "
        "of the split; found 1 class(es) outside (e.g. label 0: 0.5" in message
    )


def test_params_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("validate:\n  image_shape: [8, 8, 1]\n  class_fraction_max: 0.4\n")
    params = section(load_params(path), "validate", ValidateParams, source=str(path))
    assert params == ValidateParams(image_shape=[8, 8, 1], class_fraction_max=0.4)
    path.write_text("validate:\n  class_fraction_min: 0.6\n")
    with pytest.raises(StepError, match="class_fraction_min"):
        section(load_params(path), "validate", ValidateParams, source=str(path))
    path.write_text("validate:\n  max_duplicate_fraction: 1.5\n")
    with pytest.raises(StepError) as info:
        section(load_params(path), "validate", ValidateParams)
    assert str(info.value) == (
        f"{path}: validate: max_duplicate_fraction must be within [0, 1], got 1.5"
    )


def test_cli_exits_1_with_message(data: Path, tmp_path: Path) -> None:
    split = dataset.read_split(data, "train")
    labels = split.labels.copy()
    labels[:11] = 42
    dataset.write_split(data, "train", dataset.Split(split.images, labels))
    params = tmp_path / "params.yaml"
    params.write_text("task:\n  name: digits\nvalidate:\n  pixel_max: 255\n  min_rows: 10\n")
    out = tmp_path / "validate"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components.validate",
            "--params",
            str(params),
            "--data",
            str(data),
            "--report",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "error: data validation failed" in proc.stderr
    assert (
        "train.npz: column 'label': values must be in {0..9}; found 11 unexpected "
        "(e.g. 42 at indices 0, 1, 2, ...)" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert json.loads((out / "summary.json").read_text())["success"] is False
