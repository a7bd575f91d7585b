"""The out-of-tree segmentation task (``examples/segmentation``, ``shapes_seg``): a package of
another output kind, installed with pip, runs the whole pipeline through the unchanged steps.

- generated shapes: sample i is a function of (seed, i) alone, labelled by its dominant class;
- its data format stores a mask per image and hands masks to training and scoring as targets;
- its scorer's mean IoU, pixel accuracy and per-sample outcome on known outputs;
- the package imports only public names of ``components``;
- ``examples/segmentation/dvc.yaml`` is what ``paddle-mlops dvc-yaml`` writes;
- the whole pipeline with a tiny config (``dvc repro``, the real DVC CLI): per-pixel logits
  exported, QAT-gated on the task's outcome, scored by mean IoU, served by the C++ server and
  checked against Paddle Inference, registered as ``shapes_seg-segmenter``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from conftest import REPO, WIRING_LATENCY_BUDGET, clone_repo, pip_install_target, set_params, sh

EXAMPLE = REPO / "examples" / "segmentation"
PACKAGE = EXAMPLE / "paddle_mlops_segmentation"
PARAMS = "examples/segmentation/params.yaml"
PIPELINE = "examples/segmentation/dvc.yaml"
# the search on, at its smallest: trial 0 (the params as they are, in the plugin's space) for
# 1 epoch; so the baseline wins and no adoption seeds run (a second trial that wins costs 4
# more 5-epoch trainings, ~290 s on 2 vCPUs; search and adoption: tests/test_hpo_step.py)
HPO = {
    "enabled": True,
    "trial_epochs": 1,
    "budget": {"trials": 1, "cpus_per_trial": 1},
    "sampler": {"name": "random", "seed": 0},
    "pruner": {"name": "none"},
    "adopt": {"seeds": 2},
}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """The example installed with pip (no network, no build isolation) into a directory of
    its own, as a user installs a task package; that directory goes on PYTHONPATH."""
    src = tmp_path_factory.mktemp("segmentation-src") / "segmentation"
    subprocess.run(["cp", "-r", str(EXAMPLE), str(src)], check=True)
    return pip_install_target(src, tmp_path_factory.mktemp("segmentation-site"))


@pytest.fixture(scope="module")
def seg(plugin):
    """The installed package's module, imported from the pip-installed copy."""
    sys.path.insert(0, str(plugin))
    try:
        import paddle_mlops_segmentation

        assert Path(paddle_mlops_segmentation.__file__).is_relative_to(plugin)
        yield paddle_mlops_segmentation
    finally:
        sys.path.remove(str(plugin))
        sys.modules.pop("paddle_mlops_segmentation", None)


def _unit_batch(images: np.ndarray, labels: np.ndarray):
    from components.tasks.data import UnitBatch

    n, h, w, c = images.shape
    return UnitBatch(
        keys=[bytes(32)] * n,
        labels=labels.astype(np.int64),
        sources=["s"] * n,
        rows=np.arange(n, dtype=np.int64),
        columns={
            "image": [bytes(im) for im in images.reshape(n, -1)],
            "height": np.full(n, h, np.int32),
            "width": np.full(n, w, np.int32),
            "channels": np.full(n, c, np.int32),
        },
    )


def test_masks_mark_the_stroke_with_its_class_and_come_back_as_targets(seg):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 8, 8, 1), dtype=np.uint8)
    labels = np.array([0, 3, 9, 3, 1])
    batch = seg.with_masks(_unit_batch(images, labels), threshold=100, upscale=2)
    fmt = seg.SegmentedImages()
    table = pa.RecordBatch.from_pydict(
        {f.name: batch.columns[f.name] for f in fmt.payload_fields()},
        schema=pa.schema(fmt.payload_fields()),
    )
    big = fmt.to_samples(table)
    masks = fmt.to_targets(table)
    assert big.shape == (5, 16, 16, 1) and masks.shape == (5, 16, 16) and masks.dtype == np.int64
    np.testing.assert_array_equal(big[:, ::2, ::2], images)  # each pixel repeated 2 x 2
    stroke = big[..., 0] > 100
    np.testing.assert_array_equal(masks[stroke], np.repeat(labels + 1, stroke.sum(axis=(1, 2))))
    assert (masks[~stroke] == seg.BACKGROUND).all()


def test_generated_shapes_are_stable_under_growth_and_labelled_by_their_dominant_class(seg):
    whole = seg.shapes_batch(0, 60, 24, 7, "s")
    part = seg.shapes_batch(40, 20, 24, 7, "s")  # a later unit: the same samples 40..59
    assert whole.keys[40:] == part.keys and whole.columns["mask"][40:] == part.columns["mask"]
    assert seg.shapes_batch(0, 60, 24, 8, "s").keys[0] != whole.keys[0]  # the seed counts
    masks = np.frombuffer(b"".join(whole.columns["mask"]), np.uint8).reshape(60, 24, 24)
    images = np.frombuffer(b"".join(whole.columns["image"]), np.uint8).reshape(60, 24, 24)
    assert masks.max() <= len(seg.SHAPES) and (masks > 0).any(axis=(1, 2)).all()
    area = np.stack([(masks == c + 1).sum(axis=(1, 2)) for c in range(len(seg.SHAPES))], 1)
    np.testing.assert_array_equal(whole.labels, area.argmax(axis=1))
    assert set(whole.labels.tolist()) == {0, 1, 2}
    # shapes are bright on a dark background: the mask is where the light is
    assert images[masks > 0].mean() > 100 > images[masks == 0].mean()


def _one_hot(masks: np.ndarray, k: int) -> np.ndarray:
    return (np.arange(k)[None, :, None, None] == masks[:, None]).astype(np.float32) * 10.0


def test_the_scorer_reads_iou_pixel_accuracy_and_the_dominant_class(seg):
    names = [str(i) for i in range(10)]
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 10, 40)
    masks = np.where(rng.random((40, 6, 6)) < 0.4, (labels + 1)[:, None, None], 0)
    perfect = seg.SegmentationScorer(names)
    perfect.add(_one_hot(masks, 11), masks)
    scores = perfect.result()
    assert scores.metrics["mean_iou"] == 1.0 and scores.metrics["pixel_accuracy"] == 1.0
    np.testing.assert_array_equal(scores.y_true, labels)
    np.testing.assert_array_equal(scores.y_pred, labels)

    # every stroke painted as the next digit: pixels wrong, per-sample outcome wrong, the
    # background still right
    shifted = np.where(masks > 0, masks % 10 + 1, 0)
    wrong = seg.SegmentationScorer(names)
    for s in range(0, 40, 16):  # fed in batches
        wrong.add(_one_hot(shifted[s : s + 16], 11), masks[s : s + 16])
    scores = wrong.result()
    np.testing.assert_array_equal(scores.y_pred, (labels + 1) % 10)
    assert scores.metrics["accuracy"] == 0.0
    assert scores.report["iou"]["background"] == 1.0
    assert scores.metrics["pixel_accuracy"] == pytest.approx(float((masks == 0).mean()))

    with pytest.raises(Exception, match=r"outputs must be \[N, 11, H, W\]"):
        seg.SegmentationScorer(names).add(np.zeros((2, 10)), masks[:2])


def test_the_package_imports_only_public_names_of_components():
    """A plugin written against the seams, not against internals: every ``components``
    module and name it imports is public (no leading underscore anywhere)."""
    imported = []
    for file in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("components"):
                imported += [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                imported += [(a.name, "") for a in node.names if a.name.startswith("components")]
    assert imported, "the example imports nothing from components?"
    private = [
        (m, n) for m, n in imported if any(p.startswith("_") for p in [*m.split("."), n] if p)
    ]
    assert private == []


# --------------------------------------------------------------------------- the pipeline


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, plugin, server_binary) -> Path:
    repo = clone_repo(tmp_path_factory.mktemp("segmentation"))
    committed = (repo / PIPELINE).read_text()
    sh(repo, "paddle-mlops", "dvc-yaml", "--params", PARAMS, path=[plugin])
    own = "    - examples/segmentation/paddle_mlops_segmentation/__init__.py\n"
    # installed from a copy (not editable), the plugin's module is not a file of this clone:
    # the committed file (written with `pip install -e`) lists it, nothing else differs
    assert committed.replace(own, "") == (repo / PIPELINE).read_text()
    set_params(
        repo,
        params_file=PARAMS,
        train={"epochs": 5},
        evaluate={"latency": {"warmup": 1, "repeats": 2}},
        register={"min_accuracy": 0.0},  # a 5-epoch model; the example's floor is 0.9
        deploy={"target": "none"},  # no server left behind (tests/test_pipeline_dvc.py)
        # a 5-epoch model's int8 gate may go either way; the QAT itself is tested on digits
        # (test_qat): one epoch and a few latency repeats (3 epochs and 30 repeats at batch 64
        # cost ~40 CPU s, measured)
        qat={"allow_fp32_only": True, "epochs": 1, "latency": {"warmup": 1, "repeats": 3}},
        package={"tune": {"budget_s": 0}},  # the search is tested in test_tuning
        serving_image={
            "builder": "none",
            "golden_samples": 16,
            "latency_requests": 5,
            **WIRING_LATENCY_BUDGET,
        },
        # the search on, tiny, in the plugin's own space (the overlay replaces hpo.space: no
        # space in params, so the step asks the task: ShapesSegmentationTask.search_space)
        hpo=HPO,
    )
    sh(repo, "dvc", "repro", PIPELINE, path=[plugin])
    return repo


def _tamper_mask(data: Path, split: str) -> str:
    """Give row 0 of ``split``'s shard a mask pixel of a class that does not exist, rewrite
    the shard with pyarrow and re-pin it in snapshot.json (as a hand-written shard would be):
    only validate's rules can catch it. Returns the shard's path."""
    import hashlib

    import pyarrow.parquet as pq

    snapshot = json.loads((data / "snapshot.json").read_text())
    entry = next(e for e in snapshot["shards"] if e["split"] == split)
    path = data / entry["path"]
    table = pq.read_table(path)
    masks = table.column("mask").to_pylist()
    masks[0] = bytes([8]) + masks[0][1:]  # 8: beyond validate.mask_classes (3)
    table = table.set_column(
        table.schema.get_field_index("mask"), "mask", pa.array(masks, pa.binary())
    )
    pq.write_table(table, path)
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    entry["bytes"] = path.stat().st_size
    (data / "snapshot.json").write_text(json.dumps(snapshot))
    return entry["path"]


def test_validate_refuses_a_mask_with_a_class_that_does_not_exist(pipeline, plugin, tmp_path):
    data = tmp_path / "ingest"
    subprocess.run(["cp", "-r", str(pipeline / "outputs" / "segmentation" / "ingest"), str(data)],
                   check=True)  # fmt: skip
    shard = _tamper_mask(data, "val")
    proc = sh(pipeline, sys.executable, "-m", "components", "validate", "--params", PARAMS,
              "--data", str(data), "--report", str(tmp_path / "report"), check=False,
              path=[plugin])  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "column 'mask'" in x)
    assert line.startswith(f"  - {shard}: column 'mask': a mask holds height x width values")
    assert "found 1 of" in line and "values [8] above 3 at row 0 (" in line


def test_the_segmentation_pipeline_runs_end_to_end(pipeline):
    repo = pipeline
    out, metrics = repo / "outputs" / "segmentation", repo / "metrics" / "segmentation"
    labels = json.loads((out / "ingest" / "labels.json").read_text())
    assert labels == {"format": "segmented_image", "names": ["circle", "square", "triangle"]}
    train = json.loads((metrics / "train.json").read_text())
    assert "best_val_mean_iou" in train and train["epochs_run"] == 5

    signature = json.loads((out / "package" / "signature.json").read_text())
    assert signature["inputs"] == [{"name": "image", "shape": [-1, 1, 24, 24], "dtype": "float32"}]
    assert signature["outputs"] == [
        {"name": "mask_logits", "shape": [-1, 4, 24, 24], "dtype": "float32"}
    ]

    evaluate = json.loads((metrics / "evaluate.json").read_text())
    assert {"mean_iou", "worst_class_iou", "pixel_accuracy", "accuracy"} <= set(evaluate)
    assert 0.0 <= evaluate["worst_class_iou"] <= evaluate["mean_iou"] <= 1.0
    # even 5 epochs find every class somewhere, and separate shapes from the background
    assert evaluate["worst_class_iou"] > 0.0 and evaluate["mean_iou"] > 0.4

    qat = json.loads((metrics / "qat.json").read_text())
    # the int8 gate compared the task's per-sample outcome (the stroke's class), not pixels
    assert 0 < qat["gate_samples"] < evaluate["samples"] * 2
    assert qat["gate_worse"] + qat["gate_better"] <= qat["gate_samples"]
    assert 0.0 <= qat["fp32_accuracy"] <= 1.0

    infra = json.loads((out / "serving_image" / "infra.json").read_text())
    assert infra["infra_validated"] is True
    answers = infra["variants"][0]["checks"]["answers"]
    assert "top1_agreement" not in answers and answers["max_abs_diff"] <= 1e-3

    db = sqlite3.connect(repo / "mlflow.db")
    names = {r[0] for r in db.execute("SELECT DISTINCT name FROM model_versions").fetchall()}
    assert names == {"shapes_seg-segmenter"}
    blessing = json.loads((out / "register" / "blessing.json").read_text())
    assert blessing["blessed"] is True and blessing["model"] == "shapes_seg-segmenter"
    assert {"mean_iou", "pixel_accuracy"} <= set(blessing["challenger"])
    assert (
        yaml.safe_load((repo / PIPELINE).read_text())["stages"].keys()
        == yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].keys()
    )


def test_the_search_ran_in_the_pipeline_on_the_plugins_own_space(pipeline, seg):
    """dvc repro ran the hpo stage with the step on: its trials sampled the keys the plugin
    declares (``ShapesSegmentationTask.search_space``), scored by val mean IoU, and train
    depends on the overlay it wrote."""
    repo = pipeline
    out = repo / "outputs" / "segmentation"
    assert yaml.safe_load((repo / PARAMS).read_text())["hpo"].get("space") is None
    space = seg.ShapesSegmentationTask.search_space()
    found = json.loads((out / "hpo" / "trials.json").read_text())
    assert found["objective"] == "val_mean_iou" and found["direction"] == "maximize"
    (trial,) = found["trials"]
    assert trial["state"] == "COMPLETE" and 0.0 < trial["value"] <= 1.0
    assert {"task.options.width", "train.learning_rate"} <= set(space)
    # trial 0 runs the params as they are, on every key of the plugin's space (a key of
    # params.yaml's digits space, e.g. task.options.conv_channels, is not there)
    current = {"train.learning_rate": 0.003, "train.batch_size": 32, "task.options.width": 16}
    assert set(space) == set(current) and trial["params"] == current
    overlay = yaml.safe_load((out / "hpo" / "overlay.yaml").read_text())
    assert overlay == {"adopted": False, "params": {}}  # what train applies: nothing
    decision = yaml.safe_load((out / "hpo" / "decision.yaml").read_text())
    assert decision["objective"] == "val_mean_iou" and decision["study"] == found["study"]
    assert decision["adopted"] is False and decision["winner_params"] == current
    assert "the best trial 0 is the current params (val_mean_iou)" in decision["reason"]
    metrics = json.loads((repo / "metrics" / "segmentation" / "hpo.json").read_text())
    assert metrics["enabled"] and (metrics["trials"], metrics["fail"]) == (1, 0)
    lock = yaml.safe_load((repo / "examples" / "segmentation" / "dvc.lock").read_text())["stages"]
    assert "hpo" in lock
    deps = {d["path"]: d for d in lock["train"]["deps"]}
    overlay_md5 = hashlib.md5((out / "hpo" / "overlay.yaml").read_bytes()).hexdigest()
    assert deps["outputs/segmentation/hpo/overlay.yaml"]["md5"] == overlay_md5
