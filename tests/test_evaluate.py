"""Evaluate: metrics of the exported model on the test split, plots, latency."""

from __future__ import annotations

import csv

import numpy as np
import paddle

from components.artifacts import read_json
from components.evaluate import EvaluateParams, LatencyParams, run
from components.modelio import load_trained


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
    assert metrics["samples"] == 269

    # the same accuracy as the trained dygraph model computes on the test split
    model, _ = load_trained(digits_task, trained)
    raw, labels = digits_task.read_split(digits_data, "test")
    with paddle.no_grad():
        pred = model(paddle.to_tensor(digits_task.preprocess(raw)[0])).numpy().argmax(1)
    assert abs(metrics["accuracy"] - float((pred == labels).mean())) < 1e-9

    report = read_json(tmp_path / "eval" / "report.json")
    cm = np.asarray(report["confusion_matrix"])
    assert cm.shape == (10, 10) and cm.sum() == 269
    assert abs(np.trace(cm) / cm.sum() - metrics["accuracy"]) < 1e-9
    assert set(report["per_class"]) == {str(i) for i in range(10)}
    assert all(
        {"precision", "recall", "f1", "support"} <= set(v) for v in report["per_class"].values()
    )
    with open(tmp_path / "confusion.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 269 and set(rows[0]) == {"actual", "predicted"}
    assert (tmp_path / "eval" / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.metrics["accuracy"] == metrics["accuracy"]
