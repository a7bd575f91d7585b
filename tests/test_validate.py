"""validate: a real Great Expectations run on ingested snapshots, good and deliberately broken.

Data sets are made by the real ingest (scikit-learn's digits; a generated JSON Lines table of
texts); broken ones rewrite a split's Parquet shard, or add a hand-written one, and pin it
in ``snapshot.json`` as ingest would (path, sha256, bytes, rows), so only validate's own
rules can catch what is wrong.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.core.artifacts import StepError, read_json, sha256_file, write_json
from components.core.config import load_params, section
from components.core.data_docs import remote_references
from components.ml.data import snapshot
from components.steps.ingest import IngestParams
from components.steps.ingest import run as ingest_run
from components.steps.validate import ValidateResult, plan_groups, run_map
from components.steps.validate import run as validate_run
from components.tasks import get_task
from components.tasks.image_data import ValidateParams
from components.tasks.text_data import TextIngestParams, TextValidateParams

REPO = Path(__file__).resolve().parents[1]

DIGITS = get_task("digits")
SENTIMENT = get_task("sentiment")
TEXT_RULES = TextValidateParams(class_fraction_max=0.8)  # two classes: about half each


def run(params: ValidateParams, data_dir: Path, out_dir: Path) -> ValidateResult:
    return validate_run(params, DIGITS, data_dir, out_dir)


@pytest.fixture(scope="module")
def good_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ingest") / "data"
    ingest_run(IngestParams(source="builtin:digits", kind="builtin"), DIGITS, out)
    return out


@pytest.fixture()
def data(good_data: Path, tmp_path: Path) -> Path:
    """A private copy of the good data set to corrupt."""
    copy = tmp_path / "data"
    shutil.copytree(good_data, copy)
    return copy


# --------------------------------------------------------------------------- shards by hand


def shard_of(data: Path, split: str) -> str:
    """The path (relative to the snapshot) of the one shard of ``split``."""
    (shard,) = snapshot.load(data).split_shards(split)
    return shard.path


def read_shard(data: Path, split: str) -> pa.Table:
    return pq.read_table(data / shard_of(data, split))


def _pin(data: Path, path: str, table: pa.Table, split: str) -> dict:
    pq.write_table(table, data / path)
    labels = table.column("label").drop_null().to_numpy() if "label" in table.column_names else []
    found, counts = np.unique(labels, return_counts=True)
    return {
        "path": path,
        "sha256": sha256_file(data / path),
        "rows": table.num_rows,
        "bytes": (data / path).stat().st_size,
        "split": split,
        "unit": "by hand",
        "counts": {str(int(k)): int(v) for k, v in zip(found, counts, strict=True)},
        "unit_key": "",
    }


def write_shard(data: Path, split: str, table: pa.Table) -> str:
    """Replace the one shard of ``split`` by ``table`` (a new file, pinned in snapshot.json)."""
    path = shard_of(data, split)
    doc = read_json(data / snapshot.SNAPSHOT_FILE)
    (data / path).unlink()  # a hard link to the fixture's file: never write through it
    doc["shards"] = [
        s if s["path"] != path else _pin(data, path, table, split) for s in doc["shards"]
    ]
    write_json(data / snapshot.SNAPSHOT_FILE, doc)
    return path


def add_shard(data: Path, split: str, table: pa.Table, name: str) -> str:
    """A hand-written shard added to ``split``."""
    path = f"{snapshot.SHARD_DIR}/{name}-{split}-0000.parquet"
    doc = read_json(data / snapshot.SNAPSHOT_FILE)
    doc["shards"].append(_pin(data, path, table, split))
    write_json(data / snapshot.SNAPSHOT_FILE, doc)
    return path


def with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, values)


def where(table: pa.Table, row: int) -> str:
    """How a failure line names a row of a shard: its place and the input it came from."""
    return f"row {row} ({table.column('source')[row].as_py()}:{table.column('row')[row].as_py()})"


# --------------------------------------------------------------------------- checks


LINE = re.compile(r"  - [\w./+ -]+: column '\w+': \S")


def _fails(data_dir: Path, out_dir: Path, params: ValidateParams | None = None) -> str:
    with pytest.raises(StepError) as info:
        run(params or ValidateParams(), data_dir, out_dir)
    message = str(info.value)
    # the outputs are written even though the data failed
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["success"] is False and summary["failed"] >= 1
    assert " Failed</a></td>" in (out_dir / "data_docs" / "index.html").read_text()
    # a header naming the counts, then one line per broken rule naming shard or split and column
    header, *lines = message.splitlines()
    assert header.startswith(
        f"data validation failed ({summary['failed']} of {summary['evaluated']} expectations"
    ), header
    assert lines, message
    for line in lines:
        assert LINE.match(line), line
    assert len(lines) == len(set(lines)), message
    assert summary["failures"] and all(f in message for f in summary["failures"])
    assert (out_dir / "result.json").is_file()
    assert (out_dir / "data_docs" / "index.html").is_file()
    assert (out_dir / "manifest.json").is_file()
    return message


def test_good_data_passes(good_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "validate"
    # the real digits repeat no row: they pass even when no duplicate is allowed
    result = run(ValidateParams(max_duplicate_fraction=0.0), good_data, out)
    assert result.evaluated > 20
    summary = json.loads((out / "summary.json").read_text())
    assert summary == {**summary, "success": True, "failed": 0, "failures": []}
    assert summary["evaluated"] == result.evaluated
    snap = snapshot.load(good_data)
    rows = {s: snap.rows(s) for s in snapshot.SPLITS}
    assert summary["splits"] == rows and sum(rows.values()) == 1797
    assert summary["duplicates"] == {
        s: {"rows": n, "duplicate_rows": 0, "duplicate_fraction": 0.0, "conflicting": 0}
        for s, n in rows.items()
    }
    assert summary["overlap"] == {"train+val": 0, "train+test": 0, "val+test": 0}
    assert summary["image_shape"] == [8, 8, 1]
    assert summary["key_set_bytes"] == 32 * 1797  # the exact key sets: 32 bytes a sample
    assert summary["snapshot_sha256"] == snap.sha256
    ge_result = json.loads((out / "result.json").read_text())
    assert ge_result["success"] is True
    assets = {
        r["meta"]["active_batch_definition"]["data_asset_name"]
        for r in ge_result["validation_results"]
    }
    assert assets == {
        "train_shards", "val_shards", "test_shards", "splits", "class_counts",
        "split_overlap", "duplicates",
    }  # fmt: skip
    # the Data Docs read offline: no page fetches from another host, and the index lists
    # each validation as a static row (no JS) linking to its page
    docs = out / "data_docs"
    pages = sorted(docs.rglob("*.html"))
    assert len(pages) == 1 + 7 + 5  # the index, 7 validations, 5 suites
    assert {p.name: remote_references(p.read_text()) for p in pages} == {p.name: [] for p in pages}
    index = (docs / "index.html").read_text()
    assert "bootstrapTable" not in index and "<script" not in index
    links = re.findall(r'<a href="(validations/[^"]+)">', index)
    assert len(links) == 7 and all((docs / link).is_file() for link in links)
    assert any("train_shards.html" in link for link in links)
    assert index.count(" Success</a></td>") == 7
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["inputs"]) == {"snapshot.json", "labels.json"}
    assert manifest["inputs"]["snapshot.json"]["sha256"] == snap.sha256
    assert manifest["shards_verified"] == len(snap.shards)
    assert {"result.json", "summary.json", "data_docs"} <= set(manifest["outputs"])
    assert not list(tmp_path.glob(".validate.*"))  # no temporary left behind


def test_explicit_image_shape_passes(good_data: Path, tmp_path: Path) -> None:
    assert run(ValidateParams(image_shape=[8, 8, 1]), good_data, tmp_path / "v").evaluated > 20


def test_duplicate_rows_within_a_split(data: Path, tmp_path: Path) -> None:
    """60% of train's rows are copies of other train rows (same image, key and label)."""
    table = read_shard(data, "train")
    n = table.num_rows
    keep = int(n * 0.4)
    source = np.arange(n) % keep  # rows >= keep copy an earlier row
    path = write_shard(data, "train", table.take(source))
    message = _fails(data, tmp_path / "out")
    copies = n - keep
    assert (
        f"train split: column 'duplicate_fraction': at most 0.05 of a split's rows may be exact "
        f"duplicates (same image bytes and label) of another row; found {copies} of {n} rows "
        f"({copies / n:.3f}) (e.g. {path} row " in message
    )
    # an example names two rows of the shard holding the same image
    first, second = re.search(
        rf"\(e\.g\. {path} row (\d+) .*? == {path} row (\d+)", message
    ).groups()
    assert int(first) % keep == int(second) % keep and first != second
    assert "val split" not in message and "test split" not in message
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["duplicates"]["train"] == {
        "rows": n,
        "duplicate_rows": copies,
        "duplicate_fraction": pytest.approx(copies / n),
        "conflicting": 0,
    }
    # the same image under another label is not a duplicate row, but a conflict: one
    # sample (key) under several labels
    labels = table.column("label").to_numpy()[source] + np.arange(n) // keep  # copy k: +k
    relabelled = with_column(table.take(source), "label", pa.array(labels % 10, pa.int64()))
    write_shard(data, "train", relabelled)
    message = _fails(data, tmp_path / "out2")
    assert (
        "train split: column 'label': identical images (same key) must have one label; found "
        f"{keep} sample(s) under several labels (e.g. {path} row " in message
    )
    assert re.search(
        rf"{path} row \d+ \([^)]*\) label \d == {path} row \d+ \([^)]*\) label", message
    )
    assert "duplicate_fraction" not in message
    summary = json.loads((tmp_path / "out2" / "summary.json").read_text())
    assert summary["duplicates"]["train"]["duplicate_rows"] == 0
    assert summary["duplicates"]["train"]["conflicting"] == keep


def test_label_outside_the_label_set(data: Path, tmp_path: Path) -> None:
    table = read_shard(data, "train")
    labels = table.column("label").to_numpy().copy()
    labels[3], labels[5] = 42, -1
    path = write_shard(data, "train", with_column(table, "label", pa.array(labels)))
    message = _fails(data, tmp_path / "out")
    # label_min and label_max both fail: one line for the shard, naming both rows
    assert (
        f"  - {path}: column 'label': values must be in {{0..9}}; found 2 of {table.num_rows} "
        f"rows outside the label set (e.g. 42 at {where(table, 3)}, -1 at {where(table, 5)})"
        in message.splitlines()
    )
    assert sum(f"{path}: column 'label'" in line for line in message.splitlines()) == 1
    assert "val-0000" not in message


def test_pixel_range(data: Path, tmp_path: Path) -> None:
    """The digits' pixels span 0..255: a stricter configured range fails on every shard,
    counting the images that break it."""
    message = _fails(data, tmp_path / "out", ValidateParams(pixel_max=200))
    for split in snapshot.SPLITS:
        table = read_shard(data, split)
        images = DIGITS.data.to_samples(table.combine_chunks().to_batches()[0])
        above = int((images.reshape(len(images), -1).max(axis=1) > 200).sum())
        assert (
            f"{shard_of(data, split)}: column 'pixel_max': values must be within [0, 200]; "
            f"found 255: {above} of {table.num_rows} rows with a pixel above 200 (e.g. " in message
        )
    assert "pixel_min" not in message


def test_pixels_of_another_dtype(data: Path, tmp_path: Path) -> None:
    """Hand-written shards storing int16 pixels (one out of range) and float32 pixels (one
    NaN): the dtype, the range and NaNs are reported, each naming the shard and row."""
    val = read_shard(data, "val")
    pixels = np.frombuffer(b"".join(val.column("image").to_pylist()), np.uint8).astype(np.int16)
    pixels = pixels.reshape(val.num_rows, -1)
    pixels[5, 0] = 300
    as_int16 = pa.array(list(pixels), pa.list_(pa.int16()))
    val_path = write_shard(data, "val", with_column(val, "image", as_int16))
    test = read_shard(data, "test")
    floats = np.frombuffer(b"".join(test.column("image").to_pylist()), np.uint8)
    floats = floats.astype(np.float32).reshape(test.num_rows, -1)
    floats[7, 3] = np.nan
    test_path = write_shard(data, "test", with_column(test, "image", pa.array(list(floats))))
    message = _fails(data, tmp_path / "out")
    lines = message.splitlines()
    assert (
        f"  - {val_path}: column 'image': pixels must be stored as uint8 "
        "(validate.expected_dtype); found int16" in lines
    )
    assert (
        f"  - {val_path}: column 'pixel_max': values must be within [0, 255]; found 300: 1 of "
        f"{val.num_rows} rows with a pixel above 255 (e.g. 300 at {where(val, 5)})" in lines
    )
    assert f"  - {test_path}: column 'image': pixels must be stored as uint8 " in message
    assert (
        f"  - {test_path}: column 'image': pixels must not be NaN; found 1 of {test.num_rows} "
        f"rows with NaN pixels (e.g. {where(test, 7)})" in lines
    )
    assert shard_of(data, "train") not in message


def test_missing_class(data: Path, tmp_path: Path) -> None:
    table = read_shard(data, "val")
    keep = np.flatnonzero(table.column("label").to_numpy() != 7)
    write_shard(data, "val", table.take(keep))
    message = _fails(data, tmp_path / "out")
    assert "  - val split: column 'label': every class must appear; missing {7}" in message
    assert "train split" not in message and "test split" not in message


def test_too_few_rows(data: Path, tmp_path: Path) -> None:
    rows = {s: snapshot.load(data).rows(s) for s in snapshot.SPLITS}
    assert rows["val"] < 300 < rows["test"] < rows["train"]
    message = _fails(data, tmp_path / "out", ValidateParams(min_rows=300))
    assert message.splitlines()[1:] == [
        "  - val split: column 'rows': row count per split must be within [300, 10000000]; "
        f"found {rows['val']} in 1 shard(s)"
    ]


def test_leak_between_splits(data: Path, tmp_path: Path) -> None:
    """A hand-written train shard holding five test samples: the overlap names both rows."""
    test = read_shard(data, "test")
    leak = add_shard(data, "train", test.slice(0, 5), "leak")
    message = _fails(data, tmp_path / "out")
    assert (
        "  - train + test splits: column 'key': a sample may appear in only one split; "
        "found 5 sample(s) in both (e.g. " in message
    )
    test_path = shard_of(data, "test")
    pairs = re.findall(rf"{leak} row (\d) \([^)]*\) == {test_path} row (\d)", message)
    assert len(pairs) == 3 and all(a == b for a, b in pairs)
    assert "train + val" not in message and "val + test" not in message
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overlap"] == {"train+val": 0, "train+test": 5, "val+test": 0}


def test_wrong_image_shape(data: Path, tmp_path: Path) -> None:
    table = read_shard(data, "test")
    n = table.num_rows
    images = DIGITS.data.to_samples(table.combine_chunks().to_batches()[0])
    padded = np.pad(images, ((0, 0), (0, 1), (0, 0), (0, 0)))  # 9x8x1
    column = pa.array([im.tobytes() for im in padded], pa.binary())
    broken = with_column(
        with_column(table, "image", column), "height", pa.array([9] * n, pa.int32())
    )
    path = write_shard(data, "test", broken)
    message = _fails(data, tmp_path / "out")
    assert message.splitlines()[1:] == [
        f"  - {path}: column 'shape': images must be 8x8x1 (H x W x C: the train split's); "
        f"found 9x8x1 in all {n} rows"
    ]
    # against a configured shape every split is wrong
    message = _fails(data, tmp_path / "out2", ValidateParams(image_shape=[28, 28, 1]))
    for split in ("train", "val"):
        assert (
            f"{shard_of(data, split)}: column 'shape': images must be 28x28x1 (H x W x C: "
            "validate.image_shape); found 8x8x1 in all" in message
        )
    # an image that does not hold height x width x channels values
    short = column.to_pylist()
    short[4] = short[4][:-8]
    write_shard(data, "test", with_column(broken, "image", pa.array(short, pa.binary())))
    message = _fails(data, tmp_path / "out3")
    assert message.splitlines()[1:] == [
        f"  - {path}: column 'shape': images must be 8x8x1 (H x W x C: the train split's); "
        f"found 9x8x1 in all {n} rows",
        f"  - {path}: column 'image': an image must hold height x width x channels values; "
        f"found 1 of {n} rows with another number of values (e.g. 64 at {where(table, 4)})",
    ]


def test_shard_columns_and_types(data: Path, tmp_path: Path) -> None:
    """A hand-written shard with a column missing, one too many, int32 labels and a null."""
    table = read_shard(data, "val")
    odd = table.drop_columns(["channels"]).append_column("pixels", table.column("image"))
    labels = table.column("label").to_pylist()
    labels[2] = None
    path = write_shard(data, "val", with_column(odd, "label", pa.array(labels, pa.int32())))
    message = _fails(data, tmp_path / "out")
    lines = message.splitlines()
    assert (
        f"  - {path}: column 'schema': a shard's columns must be key, label, source, row, "
        "image, height, width, channels (docs/data-format.md); found missing ['channels']; "
        "unexpected ['pixels']" in lines
    )
    assert f"  - {path}: column 'label': labels must be stored as int64; found int32" in lines
    assert (
        f"  - {path}: column 'nulls': values must not be null; found 1 null values (label: 1)"
        in lines
    )


def test_corrupt_shard_is_one_line_with_its_sha256(data: Path, tmp_path: Path) -> None:
    snap = snapshot.load(data)
    shard = snap.split_shards("val")[0]
    target = data / shard.path
    blob = bytearray(target.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # same size: only the sha256 tells
    target.unlink()  # a hard link to the fixture's file
    target.write_bytes(bytes(blob))
    out = tmp_path / "out"
    for workers in (1, 2):  # in this process, and across the process pool's boundary
        with pytest.raises(StepError) as info:
            run(ValidateParams(workers=workers), data, out)
        assert str(info.value) == (
            f"{target}: shard sha256 is {sha256_file(target)}, snapshot.json pins "
            f"{shard.sha256}: it is corrupt; run `dvc pull` or ingest again"
        )
        assert not out.exists()  # nothing written that looks like a validated data set
    target.unlink()
    with pytest.raises(StepError) as info:
        run(ValidateParams(), data, out)
    assert str(info.value).startswith(
        f"{target}: shard missing (snapshot.json pins sha256 {shard.sha256})"
    )


def test_class_imbalance(data: Path, tmp_path: Path) -> None:
    table = read_shard(data, "train")
    labels = table.column("label").to_numpy()
    keep = np.concatenate(
        [
            np.flatnonzero(labels == c) if c == 0 else np.flatnonzero(labels == c)[:10]
            for c in range(10)
        ]
    )
    write_shard(data, "train", table.take(np.sort(keep)))
    message = _fails(data, tmp_path / "out")
    zero = (labels == 0).sum() / len(keep)
    assert message.splitlines()[1:] == [
        "  - train split: column 'fraction': each class must make up a fraction within "
        f"[0.02, 0.5] of the split; found 1 class(es) outside (e.g. label 0: {zero:.4g})"
    ]


def test_workers_and_map_reduce_parts_agree(data: Path, tmp_path: Path) -> None:
    """The same verdict in this process, on a process pool of two, and from the parts of a
    map over shard groups (what a KFP ParallelFor runs) reduced by ``run(parts=...)``."""
    table = read_shard(data, "train")
    labels = table.column("label").to_numpy().copy()
    labels[:3] = 42
    write_shard(data, "train", with_column(table, "label", pa.array(labels)))
    add_shard(data, "val", read_shard(data, "test").slice(0, 2), "leak")
    params = ValidateParams(workers=2)
    failures = {}
    for how in ("here", "pool", "parts"):
        out = tmp_path / how
        with pytest.raises(StepError):
            if how == "parts":
                groups = plan_groups(params, data)
                assert groups == ["0/2", "1/2"]
                parts = [tmp_path / f"part{i}" for i in range(len(groups))]
                read = [
                    run_map(params, DIGITS, data, g, p) for g, p in zip(groups, parts, strict=True)
                ]
                assert sum(read) == len(snapshot.load(data).shards) == 4
                validate_run(params, DIGITS, data, out, parts=parts)
            else:
                run(ValidateParams(workers=1 if how == "here" else 2), data, out)
        summary = json.loads((out / "summary.json").read_text())
        failures[how] = summary["failures"]
        assert summary["overlap"]["val+test"] == 2
    assert failures["here"] == failures["pool"] == failures["parts"]
    assert len(failures["here"]) == 2


def test_params_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(
        "validate:\n  image_shape: [8, 8, 1]\n  class_fraction_max: 0.4\n  workers: 2\n"
    )
    params = section(load_params(path), "validate", ValidateParams, source=str(path))
    assert params == ValidateParams(image_shape=[8, 8, 1], class_fraction_max=0.4, workers=2)
    path.write_text("validate:\n  class_fraction_min: 0.6\n")
    with pytest.raises(StepError, match="class_fraction_min"):
        section(load_params(path), "validate", ValidateParams, source=str(path))
    path.write_text("validate:\n  max_duplicate_fraction: 1.5\n")
    with pytest.raises(StepError) as info:
        section(load_params(path), "validate", ValidateParams)
    assert str(info.value) == (f"{path}: validate.max_duplicate_fraction: must be <= 1, got 1.5")
    path.write_text("validate:\n  workers: 0\n")
    with pytest.raises(StepError) as info:
        section(load_params(path), "validate", ValidateParams)
    assert str(info.value) == f"{path}: validate.workers: must be >= 1, got 0"


def test_every_params_file_sets_validate_workers() -> None:
    for name in ("params.yaml", "tasks/sentiment/params.yaml", "tasks/digits_gan/params.yaml"):
        assert load_params(REPO / name)["validate"]["workers"] == 1, name


def test_cli_exits_1_with_message(data: Path, tmp_path: Path) -> None:
    table = read_shard(data, "train")
    labels = table.column("label").to_numpy().copy()
    labels[:11] = 42
    path = write_shard(data, "train", with_column(table, "label", pa.array(labels)))
    params = tmp_path / "params.yaml"
    params.write_text("task:\n  name: digits\nvalidate:\n  pixel_max: 255\n  min_rows: 10\n")
    out = tmp_path / "validate"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "components",
            "validate",
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
        f"{path}: column 'label': values must be in {{0..9}}; found 11 of {table.num_rows} rows "
        f"outside the label set (e.g. 42 at {where(table, 0)}, 42 at {where(table, 1)}, 42 at "
        f"{where(table, 2)}, ...)" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert json.loads((out / "summary.json").read_text())["success"] is False


# --------------------------------------------------------------------------- texts


@pytest.fixture(scope="module")
def text_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("texts")
    words = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]
    rng = np.random.default_rng(0)
    with open(root / "reviews.jsonl", "w", encoding="utf-8") as fh:
        for i in range(400):
            text = f"review {i}: " + " ".join(rng.choice(words, 6)) + " 好"
            fh.write(json.dumps({"text": text, "label": i % 2}, ensure_ascii=False) + "\n")
    out = root / "data"
    ingest_run(TextIngestParams(source=str(root / "reviews.jsonl"), kind="table"), SENTIMENT, out)
    return out


def test_clean_texts_pass(text_data: Path, tmp_path: Path) -> None:
    result = validate_run(TEXT_RULES, SENTIMENT, text_data, tmp_path / "v")
    assert result.evaluated > 20
    summary = json.loads((tmp_path / "v" / "summary.json").read_text())
    assert summary["format"] == "text" and summary["success"]
    assert sum(summary["splits"].values()) == 400
    assert summary["text_chars"] == [1, 5000]


def test_broken_texts_name_shard_row_column_and_rule(text_data: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(text_data, data)
    table = read_shard(data, "train")
    texts = [t.encode("utf-8") for t in table.column("text").to_pylist()]
    texts[0] = b"  "
    texts[1] = "好".encode() * 400
    texts[2] = b"caf\xe9"  # latin-1, not UTF-8: a Parquet string column does not check it
    stored = pa.array(texts, pa.binary()).view(pa.string())
    labels = table.column("label").to_numpy().copy()
    labels[1] = 7
    broken = with_column(with_column(table, "text", stored), "label", pa.array(labels))
    path = write_shard(data, "train", broken)
    with pytest.raises(StepError) as err:
        validate_run(
            TextValidateParams(class_fraction_max=0.8, max_chars=300),
            SENTIMENT,
            data,
            tmp_path / "v",
        )
    assert str(err.value).splitlines()[1:] == [
        f"  - {path}: column 'label': values must be in {{0, 1}}; found 1 of {table.num_rows} "
        f"rows outside the label set (e.g. 7 at {where(table, 1)})",
        f"  - {path}: column 'text': texts must be valid UTF-8; found 1 of {table.num_rows} rows "
        f"not valid UTF-8 (e.g. byte 0xe9 (offset 3) at {where(table, 2)})",
        f"  - {path}: column 'text': texts must not be blank; found 1 of {table.num_rows} rows "
        f"blank (e.g. '  ' at {where(table, 0)})",
        f"  - {path}: column 'text': a text's length in characters must be within [1, 300] "
        f"(validate.min_chars, max_chars); found 400: 1 of {table.num_rows} rows over 300 "
        f"characters (e.g. 400 at {where(table, 1)})",
    ]
    assert (tmp_path / "v" / "summary.json").exists()  # written, also when the data fails
    # texts stored as bytes, not strings
    write_shard(data, "train", with_column(table, "text", table.column("text").cast(pa.binary())))
    with pytest.raises(StepError) as err:
        validate_run(TEXT_RULES, SENTIMENT, data, tmp_path / "v2")
    assert str(err.value).splitlines()[1:] == [
        f"  - {path}: column 'text': texts must be strings; found 'bytes'"
    ]
