"""Evaluate: metrics of the exported model on the test split (streamed batch by batch), plots,
latency, and the baseline's bounded sample of the training split."""

from __future__ import annotations

import csv

import numpy as np
import paddle
import pytest

from components.core.artifacts import read_json
from components.ml.data import snapshot
from components.ml.decisions.evaluation import reservoir_sample
from components.steps.evaluate import EvaluateParams, LatencyParams, run
from components.tasks.data import iter_split
from components.tasks.trained import load_trained


def test_evaluate_scores_the_exported_model(exported, trained, digits_task, digits_data, tmp_path):
    params = EvaluateParams(latency=LatencyParams(warmup=1, repeats=3))
    result = run(
        params,
        digits_task,
        exported,
        digits_data,
        tmp_path / "eval",
        metrics_file=tmp_path / "evaluate.json",
        plots_file=tmp_path / "confusion.csv",
    )
    metrics = read_json(tmp_path / "evaluate.json")
    for key in ("accuracy", "macro_f1", "latency_ms_b1", "latency_ms_b64"):
        assert isinstance(metrics[key], float), key
    assert metrics["latency_ms_b1"] > 0 and metrics["latency_ms_b64"] > 0
    n_test = snapshot.load(digits_data).rows("test")  # every test sample of the snapshot
    assert metrics["samples"] == n_test > 0

    # the same accuracy as the trained dygraph model computes on the test split
    model, _ = load_trained(digits_task, trained)
    right = 0
    with paddle.no_grad():
        for (images,), labels in digits_task.eval_batches(digits_data, "test", 100):
            right += int((model(paddle.to_tensor(images)).numpy().argmax(1) == labels).sum())
    assert abs(metrics["accuracy"] - right / n_test) < 1e-9

    report = read_json(tmp_path / "eval" / "report.json")
    cm = np.asarray(report["confusion_matrix"])
    assert cm.shape == (10, 10) and cm.sum() == n_test
    assert abs(np.trace(cm) / cm.sum() - metrics["accuracy"]) < 1e-9
    assert set(report["per_class"]) == {str(i) for i in range(10)}
    assert all(
        {"precision", "recall", "f1", "support"} <= set(v) for v in report["per_class"].values()
    )
    with open(tmp_path / "confusion.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n_test and set(rows[0]) == {"actual", "predicted"}
    assert (tmp_path / "eval" / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.metrics["accuracy"] == metrics["accuracy"]


def test_the_scores_do_not_depend_on_the_batches_the_split_streams_in(
    exported, digits_task, digits_data, tmp_path
):
    """Scored 7 samples at a time (many batches, several per row group) or 256 at a time,
    every sample gets the same outcome, in the same order."""
    outcomes = {}
    for batch_size in (7, 256):
        run(
            EvaluateParams(batch_size=batch_size, latency=LatencyParams([1], 0, 1)),
            digits_task,
            exported,
            digits_data,
            tmp_path / f"eval{batch_size}",
            metrics_file=tmp_path / f"m{batch_size}.json",
            plots_file=tmp_path / f"c{batch_size}.csv",
        )
        outcomes[batch_size] = (tmp_path / f"c{batch_size}.csv").read_text()
    assert outcomes[7] == outcomes[256]
    assert len(outcomes[7].splitlines()) == snapshot.load(digits_data).rows("test") + 1

    # evaluate.max_steps: the split's first batches only (a smoke run on a huge split)
    result = run(
        EvaluateParams(batch_size=7, max_steps=7, latency=LatencyParams([1], 0, 1)),
        digits_task,
        exported,
        digits_data,
        tmp_path / "eval50",
        metrics_file=tmp_path / "m50.json",
        plots_file=tmp_path / "c50.csv",
    )
    assert result.metrics["samples"] == 7 * 7
    assert (tmp_path / "c50.csv").read_text().splitlines() == outcomes[7].splitlines()[:50]


def test_the_baseline_sample_is_bounded_seeded_and_uniform(digits_task, digits_data):
    """The baseline is fitted on at most ``baseline_max_samples`` training samples: the whole
    split in stream order when it fits, else a reproducible uniform sample of that size."""
    whole, labels = digits_task.read_split(digits_data, "train")

    def stream():
        return iter_split(digits_task.data, digits_data, "train", 100)

    kept, kept_labels, seen = reservoir_sample(stream(), len(whole) + 1)
    assert seen == len(whole)
    assert np.array_equal(kept, whole) and np.array_equal(kept_labels, labels)

    size = len(whole) // 4
    a, a_labels, _ = reservoir_sample(stream(), size, seed=3)
    b, b_labels, _ = reservoir_sample(stream(), size, seed=3)
    c, _, _ = reservoir_sample(stream(), size, seed=4)
    assert a.shape == (size, *whole.shape[1:]) and np.array_equal(a, b)
    assert np.array_equal(a_labels, b_labels) and not np.array_equal(a, c)
    # each kept sample is a training sample with its own label
    index = {img.tobytes(): lb for img, lb in zip(whole, labels, strict=True)}
    assert all(index[img.tobytes()] == lb for img, lb in zip(a, a_labels, strict=True))
    # uniform: samples from the first and the last quarter of the stream alike
    position = {img.tobytes(): i for i, img in enumerate(whole)}
    where = np.asarray([position[img.tobytes()] for img in a]) / len(whole)
    assert 0.15 < np.mean(where < 0.25) < 0.35 and 0.15 < np.mean(where >= 0.75) < 0.35


@pytest.mark.parametrize("classes", [2, 10, 20])
def test_confusion_figure_has_room_for_its_title_and_labels(classes, tmp_path):
    """The committed sentiment figure was 200x200 px with its title cut: every side of the
    drawn figure is now blank margin (nothing reaches the edge), at least 300 px a side."""
    from PIL import Image

    from components.ml.decisions.evaluation import confusion_png

    names = [f"class name {i}" for i in range(classes)]
    matrix = [[(i == j) * 50 + 1 for j in range(classes)] for i in range(classes)]
    confusion_png(tmp_path / "c.png", matrix, names, "test: accuracy 0.9875 " * 3)
    pixels = np.asarray(Image.open(tmp_path / "c.png").convert("L"))
    height, width = pixels.shape
    assert width >= 300 and height >= 300, (width, height)
    edges = {
        "top": pixels[:8], "bottom": pixels[-8:], "left": pixels[:, :8], "right": pixels[:, -8:]
    }  # fmt: skip
    assert {k: int(v.min()) for k, v in edges.items()} == {k: 255 for k in edges}
