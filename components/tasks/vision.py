"""Shared pieces of image-classification tasks (digits, image folders)."""

from __future__ import annotations

import functools
from typing import Annotated, Any

import numpy as np
from pydantic import Field
from tqdm import tqdm

from components.ml.data.harvest import AffineImageInverse
from components.tasks.base import Task, TensorSpec
from components.tasks.image_data import ImageData

# the options every image classification task has, as params-model field types
Mean = Annotated[list[float], Field(min_length=1)]  # one value per image channel
Std = Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)]
Shift = Annotated[int, Field(ge=0)]  # training-time random shift in pixels (after resize)


def check_channels(mean: list[float], std: list[float]) -> None:
    """Raise ``ValueError`` (reported with the params file and field) unless ``mean`` and
    ``std`` give one value per image channel each (a model validator's rule)."""
    if len(mean) != len(std):
        raise ValueError(
            f"mean {mean} and std {std} must be non-empty and of the same length "
            "(one value per image channel)"
        )


class ImageClassificationTask(Task):
    """Images stored as uint8 NHWC; preprocessing built from ``paddle.vision.transforms``."""

    data = ImageData()

    def __init__(
        self,
        image_size: tuple[int, int],
        mean: list[float],
        std: list[float],
        augment_shift: int = 0,
    ):
        if len(mean) != len(std):
            raise ValueError(f"mean {mean} and std {std} must have the same length")
        self.image_size = tuple(image_size)
        self.mean = list(mean)
        self.std = list(std)
        self.channels = len(mean)
        self.augment_shift = augment_shift

    @functools.cached_property
    def _transform(self) -> Any:
        """Resize works on HWC numpy images (OpenCV backend); ToTensor scales uint8 to [0, 1]
        and moves channels first; Normalize then applies the seed's mean/std. Built on first
        use: a step that never preprocesses (ingest, validate, register) never loads paddle."""
        from paddle.vision import transforms as T

        return T.Compose(
            [
                T.Resize(self.image_size),
                T.ToTensor(data_format="CHW"),
                T.Normalize(mean=self.mean, std=self.std, data_format="CHW"),
            ]
        )

    def input_specs(self) -> list[TensorSpec]:
        h, w = self.image_size
        return [TensorSpec("image", (-1, self.channels, h, w), "float32")]

    def preprocess(self, raw: np.ndarray) -> list[np.ndarray]:
        if raw.ndim != 4 or raw.shape[-1] != self.channels:
            raise ValueError(
                f"expected images shaped [N, H, W, {self.channels}], got {list(raw.shape)}"
            )
        h, w = self.image_size
        out = np.empty((raw.shape[0], self.channels, h, w), dtype=np.float32)
        items = range(raw.shape[0])
        if raw.shape[0] > 2000:
            items = tqdm(items, desc="preprocess", unit="img", leave=False)
        import paddle

        with paddle.no_grad():
            for i in items:
                out[i] = self._transform(np.ascontiguousarray(raw[i])).numpy()
        return [out]

    def raw_samples(self, inputs: list[np.ndarray], like: Any) -> tuple[list[Any], np.ndarray]:
        """Stored images shaped like ``like`` back from logged model inputs, by the measured
        least-squares inverse of :meth:`preprocess` (``components.ml.data.harvest``); an input no
        stored image of that shape reproduces within one grey level is not recovered."""
        shape = tuple(np.asarray(like).shape)
        inverses = self.__dict__.setdefault("_inverses", {})
        if shape not in inverses:
            inverses[shape] = AffineImageInverse(lambda raw: self.preprocess(raw)[0], shape)
        images, ok = inverses[shape].invert(inputs[0])
        return list(images), ok

    def augment(self, inputs: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
        """Shift each image by up to ``augment_shift`` pixels, filling with black."""
        if self.augment_shift <= 0:
            return inputs
        (images,) = inputs
        s = self.augment_shift
        n, c, h, w = images.shape
        # The value a black (0) pixel has after Normalize, per channel.
        fill = ((0.0 - np.asarray(self.mean)) / np.asarray(self.std)).astype(np.float32)
        padded = np.empty((n, c, h + 2 * s, w + 2 * s), dtype=np.float32)
        padded[:] = fill[None, :, None, None]
        padded[:, :, s : s + h, s : s + w] = images
        dy = rng.integers(0, 2 * s + 1, size=n)
        dx = rng.integers(0, 2 * s + 1, size=n)
        rows = dy[:, None] + np.arange(h)[None, :]
        cols = dx[:, None] + np.arange(w)[None, :]
        out = padded[
            np.arange(n)[:, None, None, None],
            np.arange(c)[None, :, None, None],
            rows[:, None, :, None],
            cols[:, None, None, :],
        ]
        return [np.ascontiguousarray(out)]

    def preprocessing_doc(self) -> dict[str, Any]:
        h, w = self.image_size
        return {
            "input_layout": "NHWC uint8 0-255 (as stored by ingest)",
            "steps": [
                {"op": "Resize", "size": [h, w], "interpolation": "bilinear"},
                {"op": "ToTensor", "scale": "1/255", "layout": "CHW"},
                {"op": "Normalize", "mean": self.mean, "std": self.std},
            ],
            "paddle": (
                f"Compose([Resize(({h}, {w})), ToTensor(data_format='CHW'), "
                f"Normalize(mean={self.mean}, std={self.std}, data_format='CHW')])"
            ),
        }
