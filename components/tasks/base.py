"""The interface every task implements."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from components.core.artifacts import StepError
from components.ml.data.features import image_features
from components.tasks.data import DataFormat, check_format, iter_split, read_split
from components.tasks.objective import Classification, Objective
from components.tasks.report import classification_report
from components.tasks.types import Optimization, SoftTargets, TrainSettings

# paddle is imported where a model is built, trained or exported, not here: the steps that
# only read a task's data format (ingest, validate) or its name (register) never load it
if TYPE_CHECKING:
    import paddle

    from components.tasks.stream import TrainingData

__all__ = [
    "ASSETS_DIR",
    "Optimization",
    "Scorer",
    "Scores",
    "SoftTargets",
    "Task",
    "TensorSpec",
    "TrainSettings",
]

ASSETS_DIR = "assets"  # under a model directory: what the task's preprocessing fitted


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as served: name, shape (-1 = dynamic) and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass
class Scores:
    """A task's verdict on a model's outputs for one split.

    ``y_true``/``y_pred`` are per-sample outcomes the paired gates compare (QAT vs fp32,
    challenger vs champion): for a classifier the label and the predicted class; for a
    conditional generator the requested class and the class the task's judge sees in the
    generated image. ``report`` is the classification report of those outcomes plus the
    task's own entries; ``metrics`` are the numbers evaluate writes, named by the task."""

    y_true: np.ndarray
    y_pred: np.ndarray
    report: dict[str, Any]
    metrics: dict[str, float]
    outputs: np.ndarray | None = None  # what the model returned, when kept whole (rarely)
    details: dict[str, Any] = field(default_factory=dict)  # task-private (features, say)
    # the model's outputs again, batch by batch in sample order (a generator's images seen
    # through another judge at blessing), without holding them all; None: not available
    replay: Callable[[], Iterator[np.ndarray]] | None = None


class Scorer:
    """A task's judge fed one batch of model outputs at a time (:meth:`Task.scorer`): it keeps
    only per-sample outcomes, so scoring a split never holds the split or all its outputs.

    Default: a classifier's logits; it keeps the label and the predicted class of every
    sample and reports accuracy, macro-F1, per-class recall and the confusion matrix."""

    def __init__(self, label_names: list[str]):
        self.label_names = label_names
        self._labels: list[np.ndarray] = []
        self._preds: list[np.ndarray] = []

    def add(self, outputs: np.ndarray, labels: np.ndarray) -> None:
        """The model's outputs for one batch of samples and those samples' labels."""
        self._labels.append(np.asarray(labels, dtype=np.int64))
        self._preds.append(np.asarray(outputs).argmax(axis=1))

    def _outcomes(self) -> tuple[np.ndarray, np.ndarray]:
        empty = np.zeros(0, dtype=np.int64)
        labels = np.concatenate(self._labels) if self._labels else empty
        preds = np.concatenate(self._preds).astype(np.int64) if self._preds else empty
        return labels, preds

    def result(self) -> Scores:
        labels, y_pred = self._outcomes()
        report = classification_report(labels, y_pred, self.label_names)
        metrics = {
            "accuracy": report["accuracy"],
            "macro_f1": report["macro_f1"],
            "worst_class_recall": min(
                (c["recall"] for c in report["per_class"].values()), default=0.0
            ),
        }
        return Scores(labels, y_pred, report, metrics)


class Task(abc.ABC):
    """A model family with its data (format, reader, validation), preprocessing, recipe,
    input signature and the assets exported beside the model."""

    name: ClassVar[str]
    data: ClassVar[DataFormat]  # how its raw data is read, stored, split and validated
    # exported programs: PIR (always) and the legacy ProgramDesc that OpenVINO and the int8
    # path read; a model that cannot be saved in the legacy format leaves it out and asks for
    # "onnx" (the PIR program through paddle2onnx), which OpenVINO reads instead
    export_formats: ClassVar[tuple[str, ...]] = ("pir", "legacy")
    # the model's output is class logits (export and serving checks then also compare top-1
    # classes); a generator's is not
    outputs_logits: ClassVar[bool] = True
    # what the per-sample outcome the gates compare is called (y_true == y_pred of Scores)
    outcome: ClassVar[str] = "accuracy"
    # what the registered model is: its default name is "<task>-<model_kind>"
    # (registry.model_name overrides it)
    model_kind: ClassVar[str] = "classifier"  # (every built-in task's: BUILTIN_MODEL_KIND)

    @classmethod
    @abc.abstractmethod
    def from_options(
        cls, options: dict[str, Any], *, where: str = "params.yaml: task.options"
    ) -> Task:
        """Build the task from ``task.options`` (validated; errors start with ``where``)."""

    @classmethod
    def search_space(cls) -> dict[str, Any] | None:
        """The hyperparameter search space the ``hpo`` step uses when ``hpo.space`` is null
        (a plug-in's own; dotted keys -> specs, as in params.yaml): None, none declared."""
        return None

    @abc.abstractmethod
    def build_model(self, num_classes: int) -> paddle.nn.Layer:
        """A freshly initialised model (the caller seeds paddle first)."""

    @abc.abstractmethod
    def input_specs(self) -> list[TensorSpec]:
        """Model inputs in forward() order, batch dimension -1."""

    def output_specs(self, num_classes: int) -> list[TensorSpec]:
        return [TensorSpec("logits", (-1, num_classes), "float32")]

    def serving_model(self, model: paddle.nn.Layer) -> paddle.nn.Layer:
        """The part of the trained model that is exported and served (default: all of it; a
        GAN serves its generator)."""
        return model

    # ------------------------------------------------------------ scoring (evaluate, gates)
    # Every step scores a split as a stream: :meth:`eval_batches` yields the model inputs batch
    # by batch (in the snapshot's order) and :meth:`scorer` judges the outputs batch by batch.

    def eval_batches(
        self, data_dir: str | Path, split: str, batch_rows: int = 256
    ) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
        """The model inputs ``split`` is scored on and each sample's label, ``batch_rows`` at
        most at a time, in the snapshot's order (default: the stored samples preprocessed)."""
        check_format(data_dir, self.data, self.name)
        for raw, labels in iter_split(self.data, data_dir, split, batch_rows):
            yield self.preprocess(raw), labels

    def eval_head(
        self, data_dir: str | Path, split: str, count: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """The model inputs and labels of the first ``count`` samples of ``split`` (or all, if
        fewer): only the row groups they are in are read."""
        parts: list[tuple[list[np.ndarray], np.ndarray]] = []
        have = 0
        for inputs, labels in self.eval_batches(data_dir, split, max(1, min(count, 1024))):
            take = min(len(labels), count - have)
            parts.append(([x[:take] for x in inputs], labels[:take]))
            have += take
            if have >= count:
                break
        return _concat_inputs(parts)

    def eval_inputs(self, data_dir: str | Path, split: str) -> tuple[list[np.ndarray], np.ndarray]:
        """All of :meth:`eval_batches` at once: for tests and small checks only; steps
        stream."""
        return _concat_inputs(list(self.eval_batches(data_dir, split)))

    def scorer(self, data_dir: str | Path, split: str, label_names: list[str]) -> Scorer:
        """A fresh judge of the model's outputs on :meth:`eval_batches` of ``split``, fed batch
        by batch (default: a classifier's logits, :class:`Scorer`)."""
        return Scorer(label_names)

    def score(
        self,
        outputs: np.ndarray,
        labels: np.ndarray,
        data_dir: str | Path,
        split: str,
        label_names: list[str],
    ) -> Scores:
        """Judge outputs already in memory for all of ``split`` (:meth:`eval_inputs`): the
        :meth:`scorer` fed in batches; steps feed it as they predict instead."""
        scorer = self.scorer(data_dir, split, label_names)
        for s in range(0, len(labels), 256):
            scorer.add(outputs[s : s + 256], labels[s : s + 256])
        scores = scorer.result()
        if scores.replay is None:
            scores.replay = lambda: (outputs[s : s + 256] for s in range(0, len(outputs), 256))
        return scores

    # ------------------------------------------------------------ the MLflow pyfunc model

    def pyfunc_examples(
        self, data_dir: str | Path, split: str, count: int, max_bytes: int
    ) -> tuple[Any, list[int]]:
        """An input example of the logged model and the per-sample shape it checks (default:
        the first stored samples of ``split``, preprocessed inside the model)."""
        raw, _ = self.read_head(data_dir, split, count)
        return self.data.input_examples(raw, count, max_bytes)

    def pyfunc_inputs(self, model_input: Any, shape: list[int]) -> list[np.ndarray]:
        """A pyfunc request as model inputs; ``ValueError`` for a bad request (default: stored
        samples, preprocessed)."""
        return self.preprocess(self.data.model_input(model_input, shape))

    def blessing_checks(
        self, challenger: Scores, champion: Scores
    ) -> tuple[list[str], dict[str, Any]]:
        """Blessing rules of this task beyond the paired per-sample ones the register step
        applies to every task: the failures (empty: passed) and the facts they rest on
        (default: none)."""
        return [], {}

    def figures(self, dest: Path, scores: Scores, label_names: list[str]) -> list[Path]:
        """Images evaluate writes into ``dest`` beside the confusion matrix (default: none)."""
        return []

    @abc.abstractmethod
    def preprocess(self, raw: np.ndarray) -> list[np.ndarray]:
        """Turn a batch of stored samples into model inputs (one array per input spec)."""

    def objective(self) -> Objective:
        """How the model learns and what early stopping follows (default: classification,
        accuracy)."""
        return Classification()

    def optimization(self, model: paddle.nn.Layer, settings: TrainSettings) -> Optimization:
        """The optimizer and schedule of this task's recipe. Default (the image tasks): Adam,
        the learning rate multiplied by ``lr_gamma`` every ``lr_step_size`` epochs."""
        import paddle

        scheduler = paddle.optimizer.lr.StepDecay(
            learning_rate=settings.learning_rate,
            step_size=settings.lr_step_size,
            gamma=settings.lr_gamma,
        )
        optimizer = paddle.optimizer.Adam(
            learning_rate=scheduler,
            parameters=model.parameters(),
            weight_decay=settings.weight_decay or None,
        )
        return Optimization(optimizer, scheduler)

    # ------------------------------------------------------------ fitted preprocessing (assets)
    # A task whose preprocessing is fitted on the training split (a tokenizer vocabulary, say)
    # fits it in train, saves it under ``assets/`` of the trained model (export and package copy
    # it beside the program) and loads it back wherever a step preprocesses for a model.

    def fit_preprocessing(
        self, data: TrainingData | np.ndarray, labels: np.ndarray | None = None
    ) -> None:
        """Fit the preprocessing (or a judge of the outputs) on the training split, streamed
        (``data``: :class:`components.tasks.stream.TrainingData`; stored samples and
        ``labels`` in memory are accepted too, see ``stream.as_training_data``). Default:
        nothing."""
        return None

    def save_assets(self, dest: Path) -> None:
        """Write what :meth:`fit_preprocessing` fitted into ``dest`` (default: nothing)."""
        return None

    def load_assets(self, root: Path) -> None:
        """Load the assets saved under ``root/assets`` (:data:`ASSETS_DIR`; default: nothing
        to load)."""
        return None

    def pretrain(self, model: paddle.nn.Layer, data: TrainingData) -> dict[str, Any]:
        """Unsupervised pretraining of a fresh ``model`` on the training split (streamed:
        ``data.epochs`` gives preprocessed shuffled batches) before fine-tuning (ERNIE's
        masked-language objective, say); returns facts for the train metrics (default: none,
        nothing done)."""
        return {}

    def soft_targets(self, data: TrainingData, num_classes: int) -> SoftTargets | None:
        """Soft labels to distil from while training, one row per training sample with its
        key (``SoftTargets.keys``: the train step looks them up by key). Default: none,
        labels only."""
        return None

    def baseline(self) -> Any | None:
        """A simple scikit-learn model (``fit``/``predict`` on lists of stored samples) that
        evaluate trains on a bounded seeded sample of the training split
        (``evaluate.baseline_max_samples``) and scores beside the task's model on the same
        split, so a model that cannot beat it says so (default: none)."""
        return None

    def monitor_features(self, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Per-sample scalar features of model inputs (as the server logs them) that the
        monitor compares between reference and live traffic, one two-sample test each
        (``components.ml.decisions.monitoring``). Default: an image input's intensity and shape
        statistics (:func:`~components.ml.decisions.monitoring.image_features`); none for other
        inputs (the monitor then judges predictions and accuracy only)."""
        x = inputs[0] if inputs else None
        if x is not None and x.dtype.kind == "f" and x.ndim == 4:
            return image_features(x)
        return {}

    def raw_samples(self, inputs: list[np.ndarray], like: Any) -> tuple[list[Any], np.ndarray]:
        """The stored samples (as ingest stores them, like the stored sample ``like``) that
        logged model inputs came from, and which of them could be recovered (``bool [N]``):
        what ``harvest`` writes back into the source. Default: none can (an error)."""
        raise StepError(
            f"task {self.name}: cannot turn logged inputs back into stored samples, so its "
            "logged traffic cannot be harvested"
        )

    def int8_blocker(self) -> str | None:
        """Why this task's model cannot be quantized and exported as int8 on this stack
        (None: it can). The qat step stops on it unless ``qat.allow_fp32_only``."""
        return None

    def batches(
        self, inputs: list[np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """The sample indices of each training batch of one block: ``inputs`` are samples the
        shuffle buffer drew (``components.tasks.stream``), whole batches' worth but for the
        epoch's last block. Every batch must hold ``batch_size`` samples but one smaller
        batch per block (the stream moves it to the end). Default: a random permutation cut
        into batches."""
        order = rng.permutation(len(inputs[0]))
        return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]

    def collate(self, batch: list[np.ndarray]) -> list[np.ndarray]:
        """A batch of preprocessed inputs as the model runs it in training and validation
        (default: as is; a text task drops the padding every sample of the batch has)."""
        return batch

    def augment(self, inputs: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
        """Training-time augmentation of a preprocessed batch (default: none)."""
        return inputs

    @abc.abstractmethod
    def preprocessing_doc(self) -> dict[str, Any]:
        """How a client turns a raw sample into model input; written into signature.json."""

    def read_split(self, data_dir: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Stored samples and int64 labels of one split, whole (compatibility, for tests and
        small checks: steps read splits as streams, :meth:`eval_batches`,
        :func:`components.tasks.data.iter_split`, or only their head, :meth:`read_head`)."""
        check_format(data_dir, self.data, self.name)
        data = read_split(self.data, data_dir, split)
        return data.samples, data.labels.astype(np.int64)

    def read_head(
        self, data_dir: str | Path, split: str, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The first ``count`` stored samples (or all, if fewer) and int64 labels of ``split``
        in the snapshot's order; only the row groups they are in are read."""
        check_format(data_dir, self.data, self.name)
        samples, labels, have = [], [], 0
        for raw, lbl in iter_split(self.data, data_dir, split, max(1, min(count, 1024))):
            take = min(len(lbl), count - have)
            samples.append(raw[:take])
            labels.append(lbl[:take])
            have += take
            if have >= count:
                break
        if not samples:
            return self.data.to_samples(None), np.zeros(0, dtype=np.int64)
        return np.concatenate(samples), np.concatenate(labels).astype(np.int64)

    def paddle_input_specs(self) -> list[paddle.static.InputSpec]:
        import paddle

        return [
            paddle.static.InputSpec(shape=list(s.shape), dtype=s.dtype, name=s.name)
            for s in self.input_specs()
        ]


def _concat_inputs(
    parts: list[tuple[list[np.ndarray], np.ndarray]],
) -> tuple[list[np.ndarray], np.ndarray]:
    """Batches of model inputs and labels as one batch."""
    if not parts:
        raise StepError("no samples: the split is empty (run ingest)")
    inputs = [np.concatenate(xs) for xs in zip(*(p[0] for p in parts), strict=True)]
    return inputs, np.concatenate([p[1] for p in parts])
