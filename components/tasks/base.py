"""The interface every task implements."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import paddle

from components.tasks.data import DataFormat, check_format, read_split

if TYPE_CHECKING:
    from components.tasks.objective import Objective

ASSETS_DIR = "assets"  # under a model directory: what the task's preprocessing fitted


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as served: name, shape (-1 = dynamic) and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class TrainSettings:
    """The ``train`` params a task's recipe reads (the train step fills it)."""

    learning_rate: float
    weight_decay: float
    epochs: int
    steps_per_epoch: int
    lr_step_size: int  # the step-decay recipe's (image tasks)
    lr_gamma: float


@dataclass(frozen=True)
class SoftTargets:
    """A teacher's class probabilities for every training sample, for distillation: the
    loss becomes ``(1 - weight) * CE(labels) + weight * T^2 * KL(teacher || model)`` on
    logits softened by temperature ``T``."""

    probabilities: np.ndarray  # [N, K], rows sum to 1, in training-split order
    weight: float
    temperature: float
    facts: dict[str, Any]  # for the train metrics (e.g. the teacher's accuracy)


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
    outputs: np.ndarray | None = None  # what the model returned (a generator's images)
    details: dict[str, Any] = field(default_factory=dict)  # task-private (features, say)


@dataclass(frozen=True)
class Optimization:
    """What a task trains with: the optimizer, its learning-rate schedule, and whether the
    schedule advances after every batch (warmup/decay recipes) or after every epoch."""

    optimizer: paddle.optimizer.Optimizer
    scheduler: paddle.optimizer.lr.LRScheduler
    per_batch: bool = False


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

    @classmethod
    @abc.abstractmethod
    def from_options(
        cls, options: dict[str, Any], *, where: str = "params.yaml: task.options"
    ) -> Task:
        """Build the task from ``task.options`` (validated; errors start with ``where``)."""

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

    def eval_inputs(self, data_dir: str | Path, split: str) -> tuple[list[np.ndarray], np.ndarray]:
        """The model inputs a split is scored on and each sample's label (default: the stored
        samples preprocessed)."""
        raw, labels = self.read_split(data_dir, split)
        return self.preprocess(raw), labels

    def score(
        self,
        outputs: np.ndarray,
        labels: np.ndarray,
        data_dir: str | Path,
        split: str,
        label_names: list[str],
    ) -> Scores:
        """Judge the model's ``outputs`` for :meth:`eval_inputs` of ``split`` (default: a
        classifier's logits: accuracy, macro-F1, per-class recall, the confusion matrix)."""
        from components.tasks.report import classification_report

        y_pred = outputs.argmax(axis=1)
        report = classification_report(labels, y_pred, label_names)
        metrics = {
            "accuracy": report["accuracy"],
            "macro_f1": report["macro_f1"],
            "worst_class_recall": min(c["recall"] for c in report["per_class"].values()),
        }
        return Scores(labels, y_pred, report, metrics)

    # ------------------------------------------------------------ the MLflow pyfunc model

    def pyfunc_examples(
        self, data_dir: str | Path, split: str, count: int, max_bytes: int
    ) -> tuple[Any, list[int]]:
        """An input example of the logged model and the per-sample shape it checks (default:
        stored samples of ``split``, preprocessed inside the model)."""
        raw, _ = self.read_split(data_dir, split)
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
        from components.tasks.objective import Classification

        return Classification()

    def optimization(self, model: paddle.nn.Layer, settings: TrainSettings) -> Optimization:
        """The optimizer and schedule of this task's recipe. Default (the image tasks): Adam,
        the learning rate multiplied by ``lr_gamma`` every ``lr_step_size`` epochs."""
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
        self, train_samples: np.ndarray, labels: np.ndarray | None = None
    ) -> None:
        """Fit the preprocessing (or a judge of the outputs) on the training split's stored
        samples and labels (default: nothing)."""
        return None

    def save_assets(self, dest: Path) -> None:
        """Write what :meth:`fit_preprocessing` fitted into ``dest`` (default: nothing)."""
        return None

    def load_assets(self, root: Path) -> None:
        """Load the assets saved under ``root/assets`` (:data:`ASSETS_DIR`; default: nothing
        to load)."""
        return None

    def pretrain(self, model: paddle.nn.Layer, inputs: list[np.ndarray]) -> dict[str, Any]:
        """Unsupervised pretraining of a fresh ``model`` on the preprocessed training inputs
        before fine-tuning (ERNIE's masked-language objective, say); returns facts for the
        train metrics (default: none, nothing done)."""
        return {}

    def soft_targets(
        self, train_samples: np.ndarray, train_labels: np.ndarray, num_classes: int
    ) -> SoftTargets | None:
        """Soft labels to distil from while training (default: none, labels only)."""
        return None

    def baseline(self) -> Any | None:
        """A simple scikit-learn model (``fit``/``predict`` on stored samples) that evaluate
        trains on the training split and scores beside the task's model on the same split, so
        a model that cannot beat it says so (default: none)."""
        return None

    def int8_blocker(self) -> str | None:
        """Why this task's model cannot be quantized and exported as int8 on this stack
        (None: it can). The qat step stops on it unless ``qat.allow_fp32_only``."""
        return None

    def batches(
        self, inputs: list[np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """The sample indices of each training batch of one epoch, shuffled with ``rng``
        (default: a random permutation cut into batches)."""
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
        """Stored samples and int64 labels of one split (of a data set in this task's
        format)."""
        check_format(data_dir, self.data, self.name)
        data = read_split(self.data, data_dir, split)
        return data.samples, data.labels.astype(np.int64)

    def paddle_input_specs(self) -> list[paddle.static.InputSpec]:
        return [
            paddle.static.InputSpec(shape=list(s.shape), dtype=s.dtype, name=s.name)
            for s in self.input_specs()
        ]
