"""Semantic segmentation of generated shapes: a task of another output kind, shipped
outside paddle-mlops.

Each image (``ingest.source: builtin:shapes``, generated: nothing is downloaded) holds one to
three bright circles, squares and triangles on a noisy background; every pixel is labelled
background or the class of the shape on it. A two-level U-Net predicts ``[N, K+1, H, W]``
logits (K shape classes and the background); it is scored by mean IoU, per-class IoU and
pixel accuracy. Its per-sample outcome for the paired gates (QAT, blessing) is the dominant
class: the image's label is the class covering most of its mask, the prediction the class
with the most probability summed over the mask's object pixels. The same format also
segments the digits (any image source, masks from the strokes).

It plugs in through the public seams only: the entry point ``paddle_mlops.tasks``, a
:class:`~components.tasks.data.DataFormat` whose targets are masks
(:meth:`~components.tasks.data.DataFormat.to_targets`), an
:class:`~components.tasks.objective.Objective`, a :class:`~components.tasks.base.Scorer`
and ``Task.model_kind``. See ``examples/segmentation/README.md"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import field
from typing import Annotated, Any

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from pydantic import Field, model_validator

from components.core.artifacts import StepError
from components.core.config import from_dict, params_model
from components.tasks.base import Scorer, Scores, TensorSpec
from components.tasks.data import Examples, Unit, UnitBatch
from components.tasks.image_data import (
    SHARD_COLUMNS,
    ImageData,
    ImageShardStats,
    IngestParams,
    ValidateParams,
)
from components.tasks.objective import Objective, StepContext
from components.tasks.report import classification_report
from components.tasks.stream import InputBatch
from components.tasks.vision import ImageClassificationTask, Mean, Std, check_channels

log = logging.getLogger(__name__)

BACKGROUND = 0  # mask value of a background pixel; class c is c + 1


# --------------------------------------------------------------------------- data


@params_model
class SegmentationIngestParams(IngestParams):
    """``ingest``: the image source (any kind the image format reads) and how masks are made."""

    # source builtin:shapes: generated images of circles, squares and triangles
    # images generated (sample i is the same for any count)
    shapes_count: Annotated[int, Field(ge=1)] = 2000
    shapes_size: Annotated[int, Field(ge=12, le=256)] = 24  # H = W of a generated image
    shapes_seed: int = 0
    # other sources (digits): masks from the strokes
    # a pixel above this (0-255) is stroke, the rest background
    mask_threshold: Annotated[int, Field(ge=0, lt=255)] = 64
    # each pixel repeated upscale x upscale times (images and masks)
    upscale: Annotated[int, Field(ge=1, le=8)] = 1


@params_model
class SegmentationValidateParams(ValidateParams):
    """``validate``: the image rules and the masks' class count."""

    # mask values run 0..mask_classes (0: background)
    mask_classes: Annotated[int, Field(ge=1, le=254)] = 3


class SegmentedImages(ImageData):
    """Images with a per-pixel mask (``uint8 [H, W]``: 0 background, class + 1 where an object
    of that class lies) stored beside each image; its targets are the masks, its ``label`` is
    the class covering most of the image. Sources: ``builtin:shapes`` (generated), or any the
    image format reads (digits: masks from the strokes, ``with_masks``)."""

    name = "segmented_image"
    ingest_params = SegmentationIngestParams
    validate_params = SegmentationValidateParams
    duplicate_rule = "same image bytes and label"
    shard_columns = (*SHARD_COLUMNS, "mask_bad", "mask_found")

    def decode_params(self, params: SegmentationIngestParams) -> dict[str, Any]:
        if params.source == SHAPES_SOURCE:
            return {"shapes_size": params.shapes_size, "generator": SHAPES_VERSION}
        return {
            **super().decode_params(params),
            "mask_threshold": params.mask_threshold,
            "upscale": params.upscale,
        }

    def units(self, params: SegmentationIngestParams, params_file: str) -> list[Unit]:
        if params.source != SHAPES_SOURCE:
            return super().units(params, params_file)
        step = SHAPES_PER_UNIT  # fixed runs of sample ids: growing the count adds units
        return [
            Unit(
                f"{SHAPES_SOURCE}[{a}:{min(a + step, params.shapes_count)}]",
                (SHAPES_SOURCE,),
                (("first", a), ("count", min(step, params.shapes_count - a))),
            )
            for a in range(0, params.shapes_count, step)
        ]

    def unit_inputs(self, params: SegmentationIngestParams, unit: Unit) -> dict[str, str]:
        if params.source != SHAPES_SOURCE:
            return super().unit_inputs(params, unit)
        ctx = dict(unit.context)
        return {unit.id: f"{SHAPES_VERSION}:{params.shapes_seed}:{ctx['first']}:{ctx['count']}"}

    def input_names(self, params: SegmentationIngestParams, unit: Unit) -> tuple[str, ...]:
        # every shapes unit lists the one generated source: its input is named by the unit
        if params.source != SHAPES_SOURCE:
            return super().input_names(params, unit)
        return (unit.id,)

    def label_source(self, params: SegmentationIngestParams, unit: Unit) -> str:
        return unit.id if params.source == SHAPES_SOURCE else super().label_source(params, unit)

    def fixed_label_names(
        self, params: SegmentationIngestParams, params_file: str
    ) -> list[str] | None:
        if params.source == SHAPES_SOURCE:
            return list(SHAPES)
        return super().fixed_label_names(params, params_file)

    def read_unit(
        self, params: SegmentationIngestParams, unit: Unit, params_file: str
    ) -> Iterator[UnitBatch]:
        if params.source == SHAPES_SOURCE:
            ctx = dict(unit.context)
            yield shapes_batch(
                ctx["first"], ctx["count"], params.shapes_size, params.shapes_seed, unit.id
            )
            return
        for batch in super().read_unit(params, unit, params_file):
            yield with_masks(batch, params.mask_threshold, params.upscale)

    def payload_fields(self) -> list[Any]:
        import pyarrow as pa

        # the mask: uint8 H x W, one value per pixel of the stored image
        return [*super().payload_fields(), pa.field("mask", pa.binary(), nullable=False)]

    def to_targets(self, batch: Any) -> np.ndarray:
        n = batch.num_rows
        if n == 0:
            return np.zeros((0, 0, 0), dtype=np.int64)
        h = int(batch.column("height")[0].as_py())
        w = int(batch.column("width")[0].as_py())
        flat = np.frombuffer(b"".join(batch.column("mask").to_pylist()), dtype=np.uint8)
        if flat.size != n * h * w:
            raise StepError(
                f"mask column holds {flat.size} bytes, {n} masks of {h}x{w} need {n * h * w}"
            )
        return flat.reshape(n, h, w).astype(np.int64)

    def shard_stats(self, params: SegmentationValidateParams) -> MaskShardStats:
        return MaskShardStats(params)

    def shard_expectations(
        self, params: SegmentationValidateParams, facts: dict[str, dict[str, Any]]
    ) -> tuple[list[Any], dict[str, Any]]:
        import great_expectations.expectations as gxe

        rules, found = super().shard_expectations(params, facts)
        rules.append(
            gxe.ExpectColumnValuesToBeBetween(
                column="mask_bad",
                max_value=0,
                description="masks",
                meta={
                    "column": "mask",
                    "rule": "a mask holds height x width values, each 0 (background) or a "
                    f"class + 1 up to validate.mask_classes ({params.mask_classes}), and the "
                    "image's label is the class covering most of it",
                    "found": "mask_found",
                },
            )
        )
        return rules, found


class MaskShardStats(ImageShardStats):
    """The image rules, and one more on the masks (``SegmentedImages.shard_expectations``)."""

    def __init__(self, params: SegmentationValidateParams) -> None:
        super().__init__(params)
        self.classes = params.mask_classes
        self.masks = Examples()

    def add(self, batch: Any, first: int) -> None:
        super().add(batch, first)
        if "mask" not in batch.schema.names:
            self.masks.add(
                batch,
                first,
                np.arange(batch.num_rows),
                ["no mask column"] * batch.num_rows,
                raw=True,
            )
            return
        labels = batch.column("label").to_numpy()
        pixels = batch.column("height").to_numpy().astype(np.int64) * batch.column(
            "width"
        ).to_numpy().astype(np.int64)
        bad, why = [], []
        for i, mask in enumerate(batch.column("mask").to_pylist()):
            values = np.frombuffer(mask or b"", dtype=np.uint8)
            area = np.bincount(values, minlength=self.classes + 1)
            if values.size != pixels[i]:
                bad.append(i)
                why.append(f"{values.size} values for {pixels[i]} pixels")
            elif area.size > self.classes + 1:
                bad.append(i)
                above = (np.flatnonzero(area[self.classes + 1 :]) + self.classes + 1).tolist()
                why.append(f"values {above[:3]} above {self.classes}")
            elif area[1:].any() and int(area[1:].argmax()) != labels[i]:
                bad.append(i)
                why.append(f"label {labels[i]} but class {int(area[1:].argmax())} covers most")
        self.masks.add(batch, first, np.asarray(bad, dtype=np.int64), why, raw=True)

    def result(self) -> tuple[dict[str, Any], dict[str, Any]]:
        columns, facts = super().result()
        columns["mask_bad"] = self.masks.count
        columns["mask_found"] = self.masks.found(self.rows, "with a bad mask")
        return columns, facts


SHAPES_SOURCE = "builtin:shapes"
SHAPES = ("circle", "square", "triangle")
SHAPES_VERSION = "shapes-v1"  # bump when the generator changes what sample i looks like
SHAPES_PER_UNIT = 500


def draw_shapes(index: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``index``: a noisy dark ``uint8 [size, size]`` image with one to three bright
    shapes (a later one covers an earlier one) and its mask (0 background, class + 1 where
    a shape lies). A function of (seed, index) alone."""
    rng = np.random.default_rng([seed, index])
    image = rng.integers(0, 50, (size, size)).astype(np.float64)
    mask = np.zeros((size, size), dtype=np.uint8)
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, len(SHAPES)))
        r = rng.uniform(size * 0.12, size * 0.3)
        cy, cx = rng.uniform(r, size - r, 2)
        if kind == 0:
            inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        elif kind == 1:
            inside = (np.abs(yy - cy) <= r * 0.85) & (np.abs(xx - cx) <= r * 0.85)
        else:  # apex up: |x - cx| within the half-width that grows towards the base
            t = (yy - (cy - r)) / (2 * r)
            inside = (t >= 0) & (t <= 1) & (np.abs(xx - cx) <= t * r)
        image[inside] = rng.uniform(130, 255) + rng.normal(0, 12, int(inside.sum()))
        mask[inside] = kind + 1
    return np.clip(image, 0, 255).astype(np.uint8), mask


def shapes_batch(first: int, count: int, size: int, seed: int, source: str) -> UnitBatch:
    """Generated samples ``first .. first + count - 1``; a sample's label is the shape class
    covering most of its pixels, its key the sha256 of its image and mask."""
    import hashlib

    images, masks, labels = [], [], []
    for i in range(first, first + count):
        image, mask = draw_shapes(i, size, seed)
        area = np.bincount(mask.ravel(), minlength=len(SHAPES) + 1)[1:]
        images.append(image)
        masks.append(mask)
        labels.append(int(area.argmax()))
    pairs = zip(images, masks, strict=True)
    keys = [hashlib.sha256(im.tobytes() + m.tobytes()).digest() for im, m in pairs]
    return UnitBatch(
        keys=keys,
        labels=np.asarray(labels, dtype=np.int64),
        sources=[source] * count,
        rows=np.arange(count, dtype=np.int64),
        columns={
            "image": [im.tobytes() for im in images],
            "height": np.full(count, size, np.int32),
            "width": np.full(count, size, np.int32),
            "channels": np.ones(count, np.int32),
            "mask": [m.tobytes() for m in masks],
        },
    )


def with_masks(batch: UnitBatch, threshold: int, upscale: int) -> UnitBatch:
    """``batch`` with its images upscaled and a mask column: stroke pixels (any channel above
    ``threshold``) take the image's class + 1, the others background."""
    n = len(batch)
    h, w, c = (int(batch.columns[k][0]) for k in ("height", "width", "channels")) if n else (0,) * 3
    images = np.frombuffer(b"".join(batch.columns["image"]), dtype=np.uint8).reshape(n, h, w, c)
    images = images.repeat(upscale, axis=1).repeat(upscale, axis=2)
    stroke = images.max(axis=3) > threshold
    masks = np.where(stroke, (batch.labels + 1)[:, None, None], BACKGROUND).astype(np.uint8)
    hh, ww = h * upscale, w * upscale
    batch.columns = {
        "image": [bytes(im) for im in np.ascontiguousarray(images).reshape(n, -1)],
        "height": np.full(n, hh, np.int32),
        "width": np.full(n, ww, np.int32),
        "channels": np.full(n, c, np.int32),
        "mask": [bytes(m) for m in masks.reshape(n, -1)],
    }
    return batch


# --------------------------------------------------------------------------- model


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2D(cin, cout, 3, padding=1),
        nn.ReLU(),
        nn.Conv2D(cout, cout, 3, padding=1),
        nn.ReLU(),
    )


class TinyUNet(nn.Layer):
    """A two-level U-Net: an encoder block, a 2x down-sampled block with a global-average
    context vector added back (a shape's class needs its whole outline), a 2x up-sampling
    whose output is concatenated with the encoder's (the skip connection), and a 1x1
    classifier per pixel. H and W must be even."""

    def __init__(self, in_channels: int, classes: int, width: int):
        super().__init__()
        self.enc = _block(in_channels, width)
        self.down = nn.MaxPool2D(2, 2)
        self.mid = _block(width, 2 * width)
        self.context = nn.Sequential(nn.Linear(2 * width, 2 * width), nn.ReLU())
        self.up = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"),
                                nn.Conv2D(2 * width, width, 3, padding=1), nn.ReLU())  # fmt: skip
        self.dec = _block(2 * width, width)
        self.head = nn.Conv2D(width, classes, 1)

    def forward(self, image: paddle.Tensor) -> paddle.Tensor:
        skip = self.enc(image)
        x = self.mid(self.down(skip))
        x = x + self.context(x.mean(axis=[2, 3])).unsqueeze(-1).unsqueeze(-1)
        x = self.dec(paddle.concat([self.up(x), skip], axis=1))
        return self.head(x)


# --------------------------------------------------------------------------- learning


def _confusion(pred: np.ndarray, target: np.ndarray, k: int) -> np.ndarray:
    """``k x k`` pixel counts, row the true class, column the predicted one."""
    return np.bincount(target.ravel() * k + pred.ravel(), minlength=k * k).reshape(k, k)


def iou(confusion: np.ndarray) -> np.ndarray:
    """Per-class intersection over union of a pixel confusion matrix (NaN: class absent)."""
    inter = np.diag(confusion).astype(np.float64)
    union = confusion.sum(0) + confusion.sum(1) - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / union, np.nan)


class Segmentation(Objective):
    """Per-pixel cross-entropy; early stopping follows the validation mean IoU."""

    score = "mean_iou"

    def step(
        self,
        nets: Any,
        opts: dict[str, paddle.optimizer.Optimizer],
        batch: list[paddle.Tensor],
        labels: paddle.Tensor,
        *,
        weight: float,
        ctx: StepContext,
        soft: np.ndarray | None = None,
        soft_targets: Any = None,
    ) -> dict[str, float]:
        with ctx.autocast():
            logits = nets(*batch)
        logits = logits.astype("float32")
        loss = self.loss(logits, labels)
        ctx.update(loss * weight if weight != 1.0 else loss, next(iter(opts.values())))
        n = int(labels.shape[0])
        hits = (logits.argmax(axis=1) == labels).astype("float32").mean(axis=[1, 2]).sum()
        return {"loss": float(loss) * n, "pixel_accuracy": float(hits)}

    def validate(
        self,
        task: Any,
        model: paddle.nn.Layer,
        batches: Iterable[InputBatch],
        rows: int,
        world: Any,
    ) -> dict[str, float]:
        model.eval()
        k = task.num_pixel_classes
        total_loss, confusion = 0.0, np.zeros((k, k), dtype=np.int64)
        with paddle.no_grad():
            for batch in batches:
                arrays = task.collate(batch.inputs)
                logits = model(*[paddle.to_tensor(x) for x in arrays]).astype("float32")
                if logits.shape[1] != k:
                    raise StepError(
                        f"the model answers {logits.shape[1]} pixel classes, the task expects {k}"
                    )
                y = paddle.to_tensor(batch.labels)
                loss = F.cross_entropy(logits, y, axis=1, reduction="none")
                total_loss += float(loss.reshape([loss.shape[0], -1]).mean(axis=1).sum())
                confusion += _confusion(logits.argmax(axis=1).numpy(), batch.labels, k)
        total_loss, *flat = world.all_sum([total_loss, *confusion.ravel().tolist()])
        confusion = np.asarray(flat, dtype=np.int64).reshape(k, k)
        pixels = max(int(confusion.sum()), 1)
        return {
            "loss": total_loss / rows,
            "mean_iou": float(np.nanmean(iou(confusion))),
            "pixel_accuracy": float(np.trace(confusion)) / pixels,
        }


class SegmentationScorer(Scorer):
    """Mean IoU, per-class IoU and pixel accuracy of a split (a pixel confusion matrix, the
    only thing kept besides two integers per sample), and each sample's outcome: its dominant
    class (covering most of its mask) and the class the model gives the most probability over
    the mask's object pixels."""

    def __init__(self, label_names: list[str]):
        super().__init__(label_names)
        self.k = len(label_names) + 1
        self.confusion = np.zeros((self.k, self.k), dtype=np.int64)

    def add(self, outputs: np.ndarray, labels: np.ndarray) -> None:
        outputs, masks = np.asarray(outputs, dtype=np.float32), np.asarray(labels)
        if outputs.ndim != 4 or outputs.shape[1] != self.k or outputs.shape[2:] != masks.shape[1:]:
            raise StepError(
                f"segmentation outputs must be [N, {self.k}, H, W] for masks "
                f"{list(masks.shape)}, got {list(outputs.shape)}"
            )
        self.confusion += _confusion(outputs.argmax(axis=1), masks, self.k)
        e = np.exp(outputs - outputs.max(axis=1, keepdims=True))
        prob = e / e.sum(axis=1, keepdims=True)
        classes = np.arange(1, self.k)[None, :, None, None]
        area = (masks[:, None] == classes).sum(axis=(2, 3))  # [N, K] pixels of each class
        objects = (masks != BACKGROUND)[:, None]
        painted = (prob[:, 1:] * objects).sum(axis=(2, 3))  # [N, K] over the object pixels
        truth = area.argmax(axis=1)  # the dominant class (the stored label's rule)
        self._labels.append(truth.astype(np.int64))
        self._preds.append(painted.argmax(axis=1))

    def result(self) -> Scores:
        labels, y_pred = self._outcomes()
        report = classification_report(labels, y_pred, self.label_names)
        per_class = iou(self.confusion)
        names = ["background", *self.label_names]
        report["iou"] = {
            n: None if np.isnan(v) else float(v) for n, v in zip(names, per_class, strict=True)
        }
        pixels = max(int(self.confusion.sum()), 1)
        metrics = {
            "accuracy": report["accuracy"],
            "macro_f1": report["macro_f1"],
            "worst_class_recall": min(
                (c["recall"] for c in report["per_class"].values()), default=0.0
            ),
            "mean_iou": float(np.nanmean(per_class)),
            "worst_class_iou": float(np.nanmin(per_class)),
            "pixel_accuracy": float(np.trace(self.confusion)) / pixels,
        }
        return Scores(labels, y_pred, report, metrics)


# --------------------------------------------------------------------------- the task


@params_model
class SegmentationOptions:
    # = stored size; even (the U-Net halves it)
    image_size: Annotated[
        list[Annotated[int, Field(ge=4, multiple_of=2)]], Field(min_length=2, max_length=2)
    ] = field(default_factory=lambda: [24, 24])
    mean: Mean = field(default_factory=lambda: [0.5])
    std: Std = field(default_factory=lambda: [0.5])
    # channels of the U-Net's first level (the second has twice as many)
    width: Annotated[int, Field(ge=1)] = 16

    @model_validator(mode="after")
    def _channels(self) -> SegmentationOptions:
        check_channels(self.mean, self.std)
        return self


class ShapesSegmentationTask(ImageClassificationTask):
    """Per-pixel segmentation (see the module docstring)."""

    name = "shapes_seg"
    data = SegmentedImages()
    outputs_logits = False  # per-pixel logits, not one class per sample
    outcome = "dominant_class_accuracy"
    model_kind = "segmenter"

    def __init__(self, options: SegmentationOptions):
        super().__init__(tuple(options.image_size), options.mean, options.std, 0)
        self.options = options
        self.num_pixel_classes = 0  # classes + background, set by build_model

    @classmethod
    def search_space(cls) -> dict[str, Any]:
        """The hpo step's space when params.yaml sets none: the U-Net's width and the
        schedule (the objective is val_mean_iou)."""
        return {
            "train.learning_rate": {"type": "float", "low": 0.0005, "high": 0.01, "log": True},
            "train.batch_size": {"type": "categorical", "choices": [16, 32]},
            "task.options.width": {"type": "categorical", "choices": [8, 16, 24]},
        }

    @classmethod
    def from_options(
        cls, options: dict[str, Any], *, where: str = "params.yaml: task.options"
    ) -> ShapesSegmentationTask:
        return cls(from_dict(SegmentationOptions, options, where=where))

    def build_model(self, num_classes: int) -> nn.Layer:
        self.num_pixel_classes = num_classes + 1
        return TinyUNet(self.channels, num_classes + 1, self.options.width)

    def output_specs(self, num_classes: int) -> list[TensorSpec]:
        h, w = self.image_size
        return [TensorSpec("mask_logits", (-1, num_classes + 1, h, w), "float32")]

    def preprocess(self, raw: np.ndarray) -> list[np.ndarray]:
        if raw.ndim == 4 and raw.shape[0] and tuple(raw.shape[1:3]) != self.image_size:
            raise StepError(
                f"task.options.image_size {list(self.image_size)} must be the stored image "
                f"size {list(raw.shape[1:3])} (masks are not resized)"
            )
        return super().preprocess(raw)

    def objective(self) -> Objective:
        return Segmentation()

    def scorer(self, data_dir: Any, split: str, label_names: list[str]) -> Scorer:
        return SegmentationScorer(label_names)

    def baseline(self) -> None:
        return None
