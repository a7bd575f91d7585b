"""A conditional DCGAN on the digits data (``task.name: digits_gan``): generation, not
classification.

- **Model.** The generator maps a latent vector and a requested class to a 1xHxW image in
  [-1, 1] (the digits preprocessing's range: pixels/255 normalised with mean 0.5, std 0.5):
  embedding + linear to a (H/4)x(W/4) map, two stride-2 transposed convolutions, tanh. The
  discriminator (two stride-2 convolutions, LeakyReLU, no BatchNorm so that data-parallel ranks
  follow the single-process math) answers "real?" and "which class?" (AC-GAN): the generator
  is trained to fool the first head and to be recognised by the second.
- **Training.** :class:`Adversarial` alternates one discriminator and one generator step per
  batch with their own Adam optimizers. The latents and the requested classes are drawn in
  :meth:`DigitsGanTask.augment` from the epoch's generator of the global batch, so every rank
  draws the same ones and trains on its shard (the train step's data-parallel contract).
- **Quality, measured.** A judge (a LeNet classifier, ``judge`` options) is trained on the
  training split when the generator is (its weights are an asset exported beside the model,
  so every later step scores with the same one). On a split, the generator makes one image per
  sample from a fixed latent (``eval.seed``) and the sample's class; the score is the Frechet
  distance between the judge's penultimate-layer features of the generated and of the real
  images (FID-style; lower is better) and the class agreement (the share of generated images
  the judge assigns to the requested class). Evaluate reports it next to the floor (the
  distance between the two halves of the real split) and the ceiling (an untrained
  generator).
- **Blessing.** Class agreement is a per-sample outcome, so the registry's paired rules
  (McNemar, per-class limits) apply to it unchanged; the distance is compared by a paired
  bootstrap (:meth:`DigitsGanTask.blessing_checks`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from pydantic import Field
from tqdm import tqdm

from components.core.artifacts import StepError
from components.core.config import from_dict, params_model
from components.ml.data import snapshot
from components.tasks.base import (
    ASSETS_DIR,
    Optimization,
    Scorer,
    Scores,
    TensorSpec,
    TrainSettings,
)
from components.tasks.data import check_format, iter_split
from components.tasks.digits_net import LeNet
from components.tasks.objective import Objective, StepContext
from components.tasks.report import classification_report
from components.tasks.stream import InputBatch, TrainingData, as_training_data
from components.tasks.vision import ImageClassificationTask

log = logging.getLogger(__name__)

JUDGE_FILE = "judge.pdparams"
JUDGE_META = "judge.json"


@params_model
class JudgeOptions:
    """The classifier whose features and answers score the generator."""

    conv_channels: list[int] = field(default_factory=lambda: [16, 32])
    # at least one layer (its features)
    hidden: Annotated[list[int], Field(min_length=1)] = field(default_factory=lambda: [120, 84])
    epochs: Annotated[int, Field(ge=1)] = 8
    batch_size: Annotated[int, Field(ge=1)] = 32
    learning_rate: Annotated[float, Field(gt=0)] = 0.001
    seed: int = 7


@params_model
class EvalOptions:
    seed: int = 1234  # the fixed latents a split is generated from
    grid_columns: int = 8  # samples per class in the sample grid


@params_model
class QualityOptions:
    """The blessing rule on the distance: a challenger fails when, with evidence (the lower
    ``alpha`` quantile of a paired bootstrap of the difference), its distance exceeds the
    champion's by more than ``max_fid_increase`` times the larger of the champion's distance
    and the floor (two halves of the real split: below it, differences are noise)."""

    max_fid_increase: Annotated[float, Field(ge=0)] = 0.1
    bootstrap: Annotated[int, Field(ge=20)] = 200
    alpha: Annotated[float, Field(gt=0, lt=0.5)] = 0.1
    seed: int = 0


# [H, W], multiples of 4 and >= 12
GanSide = Annotated[int, Field(ge=12, multiple_of=4)]


@params_model
class GanOptions:
    image_size: Annotated[list[GanSide], Field(min_length=2, max_length=2)] = field(
        default_factory=lambda: [28, 28]
    )
    latent_dim: Annotated[int, Field(ge=1)] = 32
    embed_dim: Annotated[int, Field(ge=1)] = 16  # the requested class's embedding
    # channels of the generator's first map and the discriminator's last (even)
    width: Annotated[int, Field(ge=4, multiple_of=2)] = 64
    beta1: Annotated[float, Field(ge=0, lt=1)] = 0.5  # Adam's, for both networks (DCGAN's)
    # the auxiliary classifier's share of both losses
    class_loss_weight: Annotated[float, Field(ge=0)] = 1.0
    judge: JudgeOptions = field(default_factory=JudgeOptions)
    eval: EvalOptions = field(default_factory=EvalOptions)
    quality: QualityOptions = field(default_factory=QualityOptions)


# --------------------------------------------------------------------------- networks


class Generator(nn.Layer):
    """(latent [N, D] float32, label [N] int64) -> image [N, 1, H, W] in [-1, 1]."""

    def __init__(self, num_classes: int, options: GanOptions):
        super().__init__()
        h, w = options.image_size
        self.map_hw = (h // 4, w // 4)
        self.width = options.width
        self.embed = nn.Embedding(num_classes, options.embed_dim)
        self.project = nn.Linear(
            options.latent_dim + options.embed_dim, options.width * (h // 4) * (w // 4)
        )
        self.up1 = nn.Conv2DTranspose(options.width, options.width // 2, 4, stride=2, padding=1)
        self.up2 = nn.Conv2DTranspose(options.width // 2, 1, 4, stride=2, padding=1)

    def forward(self, latent: paddle.Tensor, label: paddle.Tensor) -> paddle.Tensor:
        x = paddle.concat([latent, self.embed(label)], axis=1)
        x = F.relu(self.project(x)).reshape([-1, self.width, *self.map_hw])
        return paddle.tanh(self.up2(F.relu(self.up1(x))))


class Discriminator(nn.Layer):
    """image [N, 1, H, W] -> (real/fake logit [N], class logits [N, K])."""

    def __init__(self, num_classes: int, options: GanOptions):
        super().__init__()
        h, w = options.image_size
        self.conv1 = nn.Conv2D(1, options.width // 2, 4, stride=2, padding=1)
        self.conv2 = nn.Conv2D(options.width // 2, options.width, 4, stride=2, padding=1)
        features = options.width * (h // 4) * (w // 4)
        self.real = nn.Linear(features, 1)
        self.classes = nn.Linear(features, num_classes)

    def forward(self, image: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        x = F.leaky_relu(self.conv1(image), 0.2)
        x = F.leaky_relu(self.conv2(x), 0.2).flatten(1)
        return self.real(x).squeeze(1), self.classes(x)


class ConditionalGAN(nn.Layer):
    """Both networks (trained and checkpointed together); ``forward`` is the generator's."""

    def __init__(self, num_classes: int, options: GanOptions):
        super().__init__()
        self.generator = Generator(num_classes, options)
        self.discriminator = Discriminator(num_classes, options)

    def forward(self, latent: paddle.Tensor, label: paddle.Tensor) -> paddle.Tensor:
        return self.generator(latent, label)


# --------------------------------------------------------------------------- quality


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to feature sets ``a`` and ``b`` [N, F]:
    |mu_a - mu_b|^2 + tr(Ca + Cb - 2 (Ca Cb)^1/2). The trace of the matrix square root is
    taken as the sum of the square roots of the eigenvalues of Ca^1/2 Cb Ca^1/2 (symmetric
    positive semi-definite, so no complex parts from round-off)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    mu = a.mean(0) - b.mean(0)
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    vals, vecs = np.linalg.eigh(ca)
    root_a = (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T
    middle = np.linalg.eigvalsh(root_a @ cb @ root_a)
    trace_root = float(np.sqrt(np.clip(middle, 0, None)).sum())
    # >= 0 in exact arithmetic; round-off may leave a tiny negative
    return max(0.0, float(mu @ mu + np.trace(ca) + np.trace(cb) - 2.0 * trace_root))


class Judge:
    """The LeNet that scores generated images: its class answers and penultimate features."""

    def __init__(self, net: LeNet):
        self.net = net
        self.net.eval()

    def __call__(self, images: np.ndarray, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
        preds, feats = [], []
        body, head = self.net.classifier[:-1], self.net.classifier[-1]
        with paddle.no_grad():
            for s in range(0, len(images), batch_size):
                x = paddle.to_tensor(np.ascontiguousarray(images[s : s + batch_size]))
                f = body(paddle.flatten(self.net.features(x), 1))
                preds.append(head(f).numpy().argmax(1))
                feats.append(f.numpy())
        return np.concatenate(preds), np.concatenate(feats).astype(np.float64)


class GanScorer(Scorer):
    """The judge fed one batch of generated images at a time (:meth:`DigitsGanTask.scorer`).

    Per sample it keeps the requested class, the judge's answer and the judge's features (the
    distance and the blessing's paired bootstrap need them), never the images: only the first
    ``eval.grid_columns`` of each class, for the sample grid. The ceiling (an untrained
    generator on the same latents and classes) is generated and judged batch by batch too;
    the real split's features are read as a stream when the result is asked for."""

    def __init__(
        self, task: DigitsGanTask, data_dir: str | Path, split: str, label_names: list[str]
    ):
        super().__init__(label_names)
        self.task, self.data_dir, self.split = task, data_dir, split
        self.judge = task._require_judge()
        self._latents = task.latent_stream(split)  # the latents eval_batches drew, again
        paddle.seed(task.options.eval.seed)
        self._untrained = ConditionalGAN(len(label_names), task.options).generator
        self._features: list[np.ndarray] = []
        self._ceiling: list[np.ndarray] = []
        self._grid: dict[int, list[np.ndarray]] = {c: [] for c in range(len(label_names))}

    def add(self, outputs: np.ndarray, labels: np.ndarray) -> None:
        labels = np.asarray(labels, dtype=np.int64)
        preds, feats = self.judge(outputs)
        self._labels.append(labels)
        self._preds.append(preds)
        self._features.append(feats.astype(np.float32))  # the judge computes in float32
        latent = self._latents(len(labels))
        _, ceiling = self.judge(self.task.generate(self._untrained, latent, labels))
        self._ceiling.append(ceiling.astype(np.float32))
        cols = self.task.options.eval.grid_columns
        for c, kept in self._grid.items():
            room = cols - len(kept)
            if room > 0:
                kept += list(outputs[np.flatnonzero(labels == c)[:room]])

    def result(self) -> Scores:

        labels, preds = self._outcomes()
        if not self._features:
            raise StepError(f"{self.data_dir}: split {self.split} holds no samples")
        feats, ceiling = np.concatenate(self._features), np.concatenate(self._ceiling)
        real_preds, real_labels, real_feats = self.task.real_features(self.data_dir, self.split)
        half = len(real_feats) // 2
        floor = frechet_distance(real_feats[:half], real_feats[half:])
        fid = frechet_distance(feats, real_feats)
        report = classification_report(labels, preds, self.label_names)
        report["generation"] = {
            "fid": fid,
            "fid_floor": floor,
            "fid_ceiling": frechet_distance(ceiling, real_feats),
            "judge_accuracy": float((real_preds == real_labels).mean()),
            "judge": self.task.judge_facts,
        }
        metrics = {
            "class_agreement": report["accuracy"],
            "worst_class_agreement": min(c["recall"] for c in report["per_class"].values()),
            "fid": round(fid, 4),
            "fid_floor": round(floor, 4),
            "fid_ceiling": round(report["generation"]["fid_ceiling"], 4),
            "judge_accuracy": report["generation"]["judge_accuracy"],
        }
        grid = {c: np.asarray(v) for c, v in self._grid.items()}
        return Scores(
            labels,
            preds,
            report,
            metrics,
            details={"features": feats, "real": real_feats, "judge": self.judge, "grid": grid},
        )


# --------------------------------------------------------------------------- the objective


@dataclass
class GanNets:
    """What the batches go through: each network, wrapped for data parallel or not."""

    generator: Any
    discriminator: Any
    model: ConditionalGAN


class Adversarial(Objective):
    """AC-GAN: the discriminator learns real vs generated and the class of real images; the
    generator learns to pass as real and as the requested class. Score: the Frechet distance
    on the validation split (lower is better)."""

    score = "fid"
    higher_is_better = False
    sharded_validation = False  # rank 0 scores: the distance needs every sample's features

    def __init__(self, options: GanOptions):
        self.options = options
        self._real_features: np.ndarray | None = None  # of the validation split, per run

    def optimizations(
        self, task: Any, model: paddle.nn.Layer, settings: TrainSettings
    ) -> dict[str, Optimization]:
        out = {}
        for name in ("generator", "discriminator"):
            # x lr_gamma every lr_step_size epochs (any gamma: 1 keeps the rate constant)
            step, gamma = max(1, settings.lr_step_size), settings.lr_gamma
            scheduler = paddle.optimizer.lr.LambdaDecay(
                learning_rate=settings.learning_rate,
                lr_lambda=lambda epoch, step=step, gamma=gamma: gamma ** (epoch // step),
            )
            optimizer = paddle.optimizer.Adam(
                learning_rate=scheduler,
                beta1=self.options.beta1,
                parameters=getattr(model, name).parameters(),
                weight_decay=settings.weight_decay or None,
            )
            out[name] = Optimization(optimizer, scheduler)
        return out

    def parallel(self, model: paddle.nn.Layer, world_size: int) -> GanNets:
        if world_size == 1:
            return GanNets(model.generator, model.discriminator, model)
        return GanNets(
            paddle.DataParallel(model.generator), paddle.DataParallel(model.discriminator), model
        )

    def step(
        self,
        nets: GanNets,
        opts: dict[str, paddle.optimizer.Optimizer],
        batch: list[paddle.Tensor],
        labels: paddle.Tensor,
        *,
        weight: float,
        ctx: StepContext,
        soft: np.ndarray | None = None,
        soft_targets: Any = None,
    ) -> dict[str, float]:
        real, latent, wanted = batch
        n = int(real.shape[0])
        w_cls = self.options.class_loss_weight
        # discriminator: real images are real and of their class; generated ones are not real
        with paddle.no_grad():
            fake = nets.model.generator(latent, wanted)
        with ctx.autocast():
            real_logit, class_logits = nets.discriminator(paddle.concat([real, fake]))
        targets = paddle.concat([paddle.ones([n]), paddle.zeros([n])])
        d_loss = F.binary_cross_entropy_with_logits(real_logit.astype("float32"), targets)
        d_loss = d_loss + w_cls * F.cross_entropy(class_logits[:n].astype("float32"), labels)
        ctx.update(d_loss * weight, opts["discriminator"])
        # generator: through a frozen discriminator (no gradient reaches it)
        frozen = nets.model.discriminator.parameters()
        for p in frozen:
            p.stop_gradient = True
        try:
            with ctx.autocast():
                real_logit, class_logits = nets.model.discriminator(nets.generator(latent, wanted))
            g_loss = F.binary_cross_entropy_with_logits(
                real_logit.astype("float32"), paddle.ones([n])
            )
            g_loss = g_loss + w_cls * F.cross_entropy(class_logits.astype("float32"), wanted)
            ctx.update(g_loss * weight, opts["generator"])
        finally:
            for p in frozen:
                p.stop_gradient = False
        return {"d_loss": float(d_loss) * n, "g_loss": float(g_loss) * n}

    def validate(
        self,
        task: Any,
        model: paddle.nn.Layer,
        batches: Iterable[InputBatch],
        rows: int,
        world: Any,
    ) -> dict[str, float]:
        """Rank 0 scores the whole split (:attr:`sharded_validation` is off; the judge is rank
        0's), batch by batch: one image per sample from the split's fixed latents and the
        sample's class, through the judge. Only per-sample results are kept (the judge's
        answer and features; the real images' features once per run). Every rank takes rank
        0's answer, so early stopping decides the same everywhere."""
        model.eval()
        got = None
        if world.main:
            judge = task._require_judge()
            latents = task.latent_stream("val")
            real_seen = self._real_features is not None
            preds, feats, labels, real = [], [], [], []
            for batch in batches:
                images = task.generate(model.generator, latents(len(batch.labels)), batch.labels)
                p, f = judge(images)
                preds.append(p)
                feats.append(f)
                labels.append(batch.labels)
                if not real_seen:  # the same real images every epoch: their features once
                    real.append(judge(batch.inputs[0])[1])
            if not real_seen:
                self._real_features = np.concatenate(real)
            if len(labels) == 0 or sum(len(y) for y in labels) != rows:
                raise StepError(f"validation read {sum(len(y) for y in labels)} of {rows} samples")
            got = {
                "fid": frechet_distance(np.concatenate(feats), self._real_features),
                "agreement": float((np.concatenate(preds) == np.concatenate(labels)).mean()),
            }
        return world.all_gather(got)[0]


# --------------------------------------------------------------------------- the task


class DigitsGanTask(ImageClassificationTask):
    """Generation on the digits data (see the module docstring)."""

    name = "digits_gan"
    outputs_logits: ClassVar[bool] = False
    # paddle 3.3 cannot trace tanh into the legacy ProgramDesc (OldIrGuard: "tanh(): argument
    # must be Value, but got Variable"); OpenVINO (the server) reads the PIR program via ONNX
    export_formats: ClassVar[tuple[str, ...]] = ("pir", "onnx")
    outcome = "class agreement"

    def __init__(self, options: GanOptions):
        super().__init__(tuple(options.image_size), [0.5], [0.5], 0)
        self.options = options
        self.judge: Judge | None = None
        self.judge_facts: dict[str, Any] = {}
        self._real_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # a split's real features, by the judge that saw them and the split's shards
        self._real_splits: dict[tuple[str, str], tuple[Judge, tuple[np.ndarray, ...]]] = {}

    @classmethod
    def from_options(
        cls, options: dict[str, Any], *, where: str = "params.yaml: task.options"
    ) -> DigitsGanTask:
        return cls(from_dict(GanOptions, options, where=where))

    # ---- model and signature
    def build_model(self, num_classes: int) -> nn.Layer:
        return ConditionalGAN(num_classes, self.options)

    def serving_model(self, model: paddle.nn.Layer) -> paddle.nn.Layer:
        return model.generator

    def input_specs(self) -> list[TensorSpec]:
        return [
            TensorSpec("latent", (-1, self.options.latent_dim), "float32"),
            TensorSpec("label", (-1,), "int64"),
        ]

    def output_specs(self, num_classes: int) -> list[TensorSpec]:
        h, w = self.image_size
        return [TensorSpec("image", (-1, 1, h, w), "float32")]

    def objective(self) -> Objective:
        return Adversarial(self.options)

    def int8_blocker(self) -> str | None:
        return (
            "the qat step fine-tunes by distilling class logits from the fp32 parent and gates "
            "on per-sample accuracy; a generator has no logits to distil, and quantization-"
            "aware training of the adversarial objective is not implemented"
        )

    # ---- training data: real images, plus the latents and classes the generator is asked for
    def augment(self, inputs: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
        (images,) = inputs
        n = images.shape[0]
        latent = rng.standard_normal((n, self.options.latent_dim)).astype(np.float32)
        wanted = rng.integers(0, self.num_classes, size=n).astype(np.int64)
        return [images, latent, wanted]

    @property
    def num_classes(self) -> int:
        if self.judge is None:
            raise RuntimeError("the judge is not fitted or loaded (fit_preprocessing/load_assets)")
        return int(self.judge_facts["num_classes"])

    # ---- the judge: fitted on the training split, an asset beside the model
    def fit_preprocessing(
        self, data: TrainingData | np.ndarray, labels: np.ndarray | None = None
    ) -> None:
        """The judge: a LeNet trained on the training split, streamed (``judge.epochs``
        passes of shuffled batches, each seeded from ``(judge.seed, pass)``)."""
        if isinstance(data, np.ndarray) and labels is None:
            raise ValueError(f"task {self.name}: the judge needs the training labels")
        data = as_training_data(self, data, labels)
        o = self.options.judge
        num_classes = max(data.label_counts) + 1
        paddle.seed(o.seed)
        net = LeNet(num_classes, 1, self.image_size, o.conv_channels, o.hidden)
        opt = paddle.optimizer.Adam(learning_rate=o.learning_rate, parameters=net.parameters())
        net.train()
        passes = data.epochs(o.batch_size, (o.seed,), o.epochs)
        for batches in tqdm(passes, total=o.epochs, desc="judge", unit="epoch", leave=False):
            for batch in batches:
                (x,) = batch.inputs
                loss = F.cross_entropy(net(paddle.to_tensor(x)), paddle.to_tensor(batch.labels))
                loss.backward()
                opt.step()
                opt.clear_grad()
        self.judge = Judge(net)
        hits = 0
        for batch in data.samples():
            preds, _ = self.judge(self.preprocess(batch.samples)[0])
            hits += int((preds == batch.labels).sum())
        self.judge_facts = {
            "num_classes": num_classes,
            "train_accuracy": hits / max(1, data.rows),
            "options": asdict(o),
        }
        self._real_cache.clear()
        log.info("judge: train accuracy %.4f", self.judge_facts["train_accuracy"])

    def save_assets(self, dest: Path) -> None:
        if self.judge is None:
            raise RuntimeError("no judge to save: fit_preprocessing first")
        dest.mkdir(parents=True, exist_ok=True)
        paddle.save(self.judge.net.state_dict(), str(dest / JUDGE_FILE))
        (dest / JUDGE_META).write_text(json.dumps(self.judge_facts, indent=2, sort_keys=True))

    def load_assets(self, root: Path) -> None:
        folder = Path(root) / ASSETS_DIR
        weights, meta = folder / JUDGE_FILE, folder / JUDGE_META
        if not weights.exists() or not meta.exists():
            raise StepError(f"{folder}: the judge ({JUDGE_FILE}, {JUDGE_META}) is missing")
        facts = json.loads(meta.read_text())
        o = JudgeOptions(**facts["options"])
        net = LeNet(int(facts["num_classes"]), 1, self.image_size, o.conv_channels, o.hidden)
        net.set_state_dict(paddle.load(str(weights)))
        self.judge, self.judge_facts = Judge(net), facts
        self._real_cache.clear()

    # ---- generation and scoring
    def latents(self, n: int, split: str) -> np.ndarray:
        """The fixed latents a split is generated from (the same for every model)."""
        rng = np.random.default_rng([self.options.eval.seed, sum(split.encode())])
        return rng.standard_normal((n, self.options.latent_dim)).astype(np.float32)

    def latent_stream(self, split: str) -> Any:
        """``take(n)``: the next ``n`` rows of :meth:`latents` of ``split`` (drawn in chunks,
        the same rows as drawn at once)."""
        rng = np.random.default_rng([self.options.eval.seed, sum(split.encode())])
        dim = self.options.latent_dim

        def take(n: int) -> np.ndarray:
            return rng.standard_normal((n, dim)).astype(np.float32)

        return take

    def eval_batches(
        self, data_dir: str | Path, split: str, batch_rows: int = 256
    ) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
        """(latents, requested classes): one image per sample of ``split``, of its class, from
        the fixed latents; only the label column is read."""
        check_format(data_dir, self.data, self.name)
        take = self.latent_stream(split)
        for batch in snapshot.iter_batches(
            data_dir, split, batch_rows=batch_rows, columns=["label"]
        ):
            labels = batch.column("label").to_numpy().astype(np.int64)
            yield [take(len(labels)), labels], labels

    def pyfunc_examples(
        self, data_dir: str | Path, split: str, count: int, max_bytes: int
    ) -> tuple[Any, list[int]]:
        """float32 [N, 1 + latent_dim]: the requested class, then the latent vector."""
        (latent, labels), _ = self.eval_head(data_dir, split, count)
        rows = np.concatenate([labels[:, None].astype(np.float32), latent], axis=1)
        return rows, [1 + self.options.latent_dim]

    def pyfunc_inputs(self, model_input: Any, shape: list[int]) -> list[np.ndarray]:
        rows = np.asarray(model_input, dtype=np.float32)
        width = 1 + self.options.latent_dim
        if rows.ndim != 2 or rows.shape[1] != width:
            raise ValueError(
                f"expected rows of {width} numbers (class id, then {width - 1} latent values), "
                f"got shape {list(rows.shape)}"
            )
        labels = rows[:, 0]
        k = int(self.judge_facts.get("num_classes", 0))
        if not np.all(labels == np.round(labels)) or labels.min() < 0 or labels.max() >= k:
            raise ValueError(f"column 0 must hold class ids 0..{k - 1}")
        return [np.ascontiguousarray(rows[:, 1:]), labels.astype(np.int64)]

    @staticmethod
    def generate(
        generator: paddle.nn.Layer, latent: np.ndarray, labels: np.ndarray, batch_size: int = 256
    ) -> np.ndarray:
        generator.eval()
        out = []
        with paddle.no_grad():
            for s in range(0, len(labels), batch_size):
                z = paddle.to_tensor(latent[s : s + batch_size])
                y = paddle.to_tensor(labels[s : s + batch_size].astype(np.int64))
                out.append(generator(z, y).numpy())
        return np.concatenate(out)

    def _real(self, real_images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = hash(real_images.tobytes())
        if key not in self._real_cache:
            self._real_cache[key] = self._require_judge()(real_images)
        return self._real_cache[key]

    def _require_judge(self) -> Judge:
        if self.judge is None:
            raise RuntimeError("the judge is not fitted or loaded (fit_preprocessing/load_assets)")
        return self.judge

    def quality(
        self, images: np.ndarray, labels: np.ndarray, real_images: np.ndarray
    ) -> dict[str, float]:
        """Frechet distance to the real images' judge features and class agreement."""
        preds, feats = self._require_judge()(images)
        _, real_feats = self._real(real_images)
        return {
            "fid": frechet_distance(feats, real_feats),
            "agreement": float((preds == labels).mean()),
        }

    def real_features(
        self, data_dir: str | Path, split: str, batch_rows: int = 256
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The judge's answers, the labels and the judge's features (float32) of the real
        images of ``split``, read as a stream (kept per judge and split shards)."""
        judge = self._require_judge()
        key = (str(Path(data_dir).resolve()), snapshot.load(data_dir).split_sha256(split))
        cached = self._real_splits.get(key)
        if cached is not None and cached[0] is judge:
            return cached[1]  # type: ignore[return-value]
        check_format(data_dir, self.data, self.name)
        preds, labels, feats = [], [], []
        for raw, lbl in iter_split(self.data, data_dir, split, batch_rows):
            (real,) = self.preprocess(raw)
            p, f = judge(real)
            preds.append(p)
            labels.append(lbl)
            feats.append(f.astype(np.float32))
        if not labels:
            raise StepError(f"{data_dir}: split {split} holds no samples")
        out = (np.concatenate(preds), np.concatenate(labels), np.concatenate(feats))
        if len(self._real_splits) >= 4:  # a few data sets per step (register: split, holdout)
            self._real_splits.clear()
        self._real_splits[key] = (judge, out)
        return out

    def scorer(self, data_dir: str | Path, split: str, label_names: list[str]) -> Scorer:
        """The judge's class answers (the per-sample outcome: agreement with the requested
        class), the distance to the real split and its floor and ceiling (:class:`GanScorer`)."""
        return GanScorer(self, data_dir, split, label_names)

    def blessing_checks(
        self, challenger: Scores, champion: Scores
    ) -> tuple[list[str], dict[str, Any]]:
        """The distance rule (see :class:`QualityOptions`): a paired bootstrap over the samples
        (both generators made sample i from the same latent and class) and the real images."""
        q = self.options.quality
        # one yardstick: the champion's images through the challenger's judge (each bundle
        # carries its own, identical when both were trained on the same data)
        judge = challenger.details["judge"]
        a, real = challenger.details["features"], challenger.details["real"]
        if champion.replay is not None:  # the champion's images again, batch by batch
            images = champion.replay()
        elif champion.outputs is not None:
            images = iter([champion.outputs])
        else:
            return ["the champion's scores carry no generated images"], {}
        parts = [judge(batch)[1] for batch in images]
        b = np.concatenate(parts) if parts else np.zeros((0, a.shape[1]))
        if len(a) != len(b):
            return [
                f"challenger and champion scored different sample counts ({len(a)}, {len(b)})"
            ], {}
        rng = np.random.default_rng(q.seed)
        diffs = []
        for _ in tqdm(range(q.bootstrap), desc="bootstrap", leave=False):
            i = rng.integers(0, len(a), len(a))
            r = real[rng.integers(0, len(real), len(real))]
            diffs.append(frechet_distance(a[i], r) - frechet_distance(b[i], r))
        fid_a, fid_b = frechet_distance(a, real), frechet_distance(b, real)
        lower = float(np.quantile(diffs, q.alpha))
        # relative to the champion's distance, but never to less than the floor (the
        # distance between two halves of the real split): below it differences are noise
        floor = float(challenger.report.get("generation", {}).get("fid_floor", 0.0))
        limit = q.max_fid_increase * max(fid_b, floor)
        facts = {
            "fid": fid_a,
            "champion_fid": fid_b,
            "fid_increase_lower_bound": lower,
            "fid_increase_limit": limit,
            "fid_floor": floor,
        }
        failures = []
        if lower > limit:
            failures.append(
                f"distance {fid_a:.2f} vs champion {fid_b:.2f}: the increase is above "
                f"{limit:.2f} (max_fid_increase {q.max_fid_increase}) with evidence "
                f"({q.alpha:.0%} bootstrap quantile {lower:.2f})"
            )
        return failures, facts

    def figures(self, dest: Path, scores: Scores, label_names: list[str]) -> list[Path]:
        """A grid of generated samples: one row per class, ``eval.grid_columns`` columns."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cols = self.options.eval.grid_columns
        k = len(label_names)
        fig, axes = plt.subplots(k, cols, figsize=(cols * 0.8, k * 0.8), dpi=100, squeeze=False)
        grid = scores.details.get("grid")
        if grid is None and scores.outputs is not None:
            grid = {c: scores.outputs[np.flatnonzero(scores.y_true == c)[:cols]] for c in range(k)}
        for c in range(k):
            kept = (grid or {}).get(c, [])
            for j in range(cols):
                ax = axes[c][j]
                ax.axis("off")
                if j < len(kept):
                    ax.imshow((kept[j][0] + 1) / 2, cmap="gray", vmin=0, vmax=1)
            axes[c][0].set_title(label_names[c], fontsize=7, loc="left")
        fig.suptitle(
            f"agreement {scores.metrics['class_agreement']:.3f}, "
            f"distance {scores.metrics['fid']:.1f}",
            fontsize=8,
        )
        fig.tight_layout()
        path = dest / "samples.png"
        fig.savefig(path)
        plt.close(fig)
        return [path]

    def preprocessing_doc(self) -> dict[str, Any]:
        h, w = self.image_size
        return {
            "input_layout": f"latent float32 [N, {self.options.latent_dim}] ~ N(0, 1); "
            "label int64 [N]: the requested class",
            "output": f"image float32 [N, 1, {h}, {w}] in [-1, 1]; pixel = (value + 1) * 127.5",
        }
