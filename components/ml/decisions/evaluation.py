"""The task-independent parts of scoring an exported model (the evaluate step,
``components/steps/evaluate.py``): latency at each batch size, the confusion matrix as a figure
and as a DVC plot, and a seeded uniform sample of a stream (:func:`reservoir_sample`, what a
task's baseline is fitted on)."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import atomic_path

FIGURE_MIN_INCHES = 4.0  # the confusion figure's smallest side (400 px at 100 dpi)


def confusion_png(dest: Path, matrix: list[list[int]], names: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cm = np.asarray(matrix)
    side = max(FIGURE_MIN_INCHES, 1 + 0.5 * len(names))  # 2 classes: room for the title too
    fig, ax = plt.subplots(figsize=(side, side), dpi=100)
    ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=90 if len(names) > 12 else 0)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("actual")
    ax.set_title(textwrap.fill(title, 40), fontsize=10)
    for (i, j), v in np.ndenumerate(cm):
        if v:
            ax.text(
                j,
                i,
                str(v),
                ha="center",
                va="center",
                color="white" if v > cm.max() / 2 else "black",
                fontsize=8,
            )
    fig.tight_layout()
    with atomic_path(dest) as tmp:
        # the bounding box of what was drawn: no title or tick label is cut at the edge
        fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)


BASELINE_SEED = 0  # of the reservoir sample the baseline is fitted on


def reservoir_sample(
    batches: Iterable[tuple[np.ndarray, np.ndarray]], size: int, seed: int = BASELINE_SEED
) -> tuple[np.ndarray, np.ndarray, int]:
    """A uniform sample of at most ``size`` samples of a stream of (samples, labels) batches
    (reservoir sampling, algorithm R, seeded), in stream order; all of them when the stream
    is no longer. Returns the samples, their labels and how many samples streamed by."""
    rng = np.random.default_rng(seed)
    kept: list[Any] = []
    labels: list[int] = []
    order: list[int] = []  # each kept sample's position in the stream
    seen = 0
    for samples, lbl in batches:
        n = len(lbl)
        # own copies of array samples: a view would keep its whole batch alive
        own = (lambda x: x) if samples.dtype == object else np.array
        fill = min(max(size - len(kept), 0), n)
        kept += [own(x) for x in samples[:fill]]
        labels += lbl[:fill].tolist()
        order += range(seen, seen + fill)
        if fill < n:  # the reservoir is full: sample i replaces a kept one with p = size/(i+1)
            positions = np.arange(seen + fill, seen + n)
            slots = rng.integers(0, positions + 1)
            for i in np.flatnonzero(slots < size):
                slot = int(slots[i])
                kept[slot], labels[slot] = own(samples[fill + i]), int(lbl[fill + i])
                order[slot] = int(positions[i])
        seen += n
    by_position = np.argsort(order, kind="stable")
    out = np.empty(len(kept), dtype=object) if kept and isinstance(kept[0], str) else None
    if out is not None:
        out[:] = [kept[i] for i in by_position]
    else:
        out = np.stack([kept[i] for i in by_position]) if kept else np.zeros(0)
    return out, np.asarray(labels, dtype=np.int64)[by_position], seen


def latency(predictor: Any, inputs: list[np.ndarray], settings: Any) -> dict[str, float]:
    """``latency_ms_b<bs>`` of ``predictor`` at each of ``settings.batch_sizes`` (samples of
    ``inputs`` repeated where it holds fewer), with ``settings.warmup`` and ``.repeats``."""
    out: dict[str, float] = {}
    for bs in settings.batch_sizes:
        idx = np.arange(bs) % inputs[0].shape[0]  # repeat samples if the split is smaller
        out[f"latency_ms_b{bs}"] = round(
            predictor.latency_ms(
                [x[idx] for x in inputs],
                warmup=settings.warmup,
                repeats=settings.repeats,
            ),
            4,
        )
    return out


def confusion_csv(y_true: np.ndarray, y_pred: np.ndarray, names: Sequence[str]) -> str:
    """The DVC confusion plot: one ``actual,predicted`` row per sample."""
    rows = ["actual,predicted"] + [
        f"{names[a]},{names[p]}" for a, p in zip(y_true, y_pred, strict=True)
    ]
    return "\n".join(rows) + "\n"


def copy_figures(out_dir: Path, figures_dir: Path, names: Iterable[str]) -> None:
    """The images again, where ``dvc plots show`` finds them (atomically)."""
    with atomic_path(figures_dir) as tmp:
        tmp.mkdir(parents=True)
        for name in names:
            shutil.copy2(out_dir / name, tmp / Path(name).name)
