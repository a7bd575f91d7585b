"""Per-sample statistics the monitor compares (numpy only: tasks import it).

Library layer: imported by tasks and steps, imports no step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def image_features(images: np.ndarray) -> dict[str, np.ndarray]:
    """Per image [N, C, H, W] (any value range): mean and standard deviation of its values,
    and where its content lies: the centroid and the log ratio of vertical to horizontal
    spread of each pixel's distance from the image's median (its background)."""
    x = np.asarray(images, dtype=np.float64)
    n = x.shape[0]
    flat = x.reshape(n, -1)
    out = {"mean": flat.mean(1), "std": flat.std(1)}
    if x.ndim == 4:
        plane = x.mean(1)  # [N, H, W]
        weight = np.abs(plane - np.median(plane.reshape(n, -1), axis=1)[:, None, None])
        total = weight.sum((1, 2)) + 1e-12
        h, w = plane.shape[1:]
        ys = np.arange(h, dtype=np.float64)[None, :, None]
        xs = np.arange(w, dtype=np.float64)[None, None, :]
        cy = (weight * ys).sum((1, 2)) / total
        cx = (weight * xs).sum((1, 2)) / total
        vy = (weight * (ys - cy[:, None, None]) ** 2).sum((1, 2)) / total
        vx = (weight * (xs - cx[:, None, None]) ** 2).sum((1, 2)) / total
        out |= {
            "centroid_y": cy / max(h - 1, 1),
            "centroid_x": cx / max(w - 1, 1),
            "spread_ratio": 0.5 * np.log((vy + 1e-6) / (vx + 1e-6)),
        }
    return out


def token_features(ids: np.ndarray, special: Sequence[int], unk: int) -> dict[str, np.ndarray]:
    """Per text [N, L] of token ids (padding and the ``special`` ids left out, ``unk``
    counted): its length in tokens, the mean log(1 + id) of its tokens (a vocabulary built
    from the data is ordered by frequency, so rarer words have higher ids: where the words
    come from) and its share of unknown tokens (words the vocabulary never saw)."""
    x = np.asarray(ids, dtype=np.int64).reshape(len(ids), -1)
    real = ~np.isin(x, np.asarray([i for i in special if i != unk], dtype=np.int64))
    n = real.sum(1)
    per = np.maximum(n, 1)
    return {
        "tokens": n.astype(np.float64),
        "token_log_id": np.where(real, np.log1p(np.maximum(x, 0)), 0.0).sum(1) / per,
        "unk_share": (real & (x == unk)).sum(1) / per,
    }


def softmax_top1(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 class and its softmax probability per row, as the server logs them."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    return p.argmax(1), p.max(1)
