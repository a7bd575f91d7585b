"""Chinese sentiment: ERNIE 3.0 (paddlenlp) fine-tuned on texts, two or more classes.

With ``pretrained`` (a paddlenlp name such as ``ernie-3.0-medium-zh``, or a directory written
by ``save_pretrained``) the published tokenizer and weights are loaded (names need the network
once; directories never do). Without it — offline, on this project's machines and in its tests
— the task follows ERNIE's own recipe at a small size: a character-level WordPiece vocabulary
built from the training split (``[PAD]`` ``[CLS]`` ``[SEP]`` ``[MASK]`` ``[UNK]`` first), an
``ErnieConfig`` from ``task.options.model``, masked-language pretraining on the training texts
(never val or test; ``task.options.mlm``), then fine-tuning with AdamW, linear warmup and decay
and global-norm gradient clipping.

Inputs are ``input_ids`` and ``token_type_ids`` (int64, ``[batch, max_seq_len]``, padded with
``[PAD]`` = 0 to the fixed length so a server can merge requests; the attention mask follows
from the padding). The vocabulary and tokenizer configuration are assets exported beside the
model, so every step and the C++ server tokenize exactly as training did.
"""

from __future__ import annotations

import logging
import math
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from pydantic import Field, model_validator
from tqdm import tqdm

from components.core.artifacts import StepError, read_json, write_json
from components.core.config import from_dict, params_model
from components.ml.data.features import token_features
from components.tasks.base import (
    ASSETS_DIR,
    Optimization,
    SoftTargets,
    Task,
    TensorSpec,
    TrainSettings,
)
from components.tasks.stream import TrainingData, as_training_data
from components.tasks.text_data import TextData

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]  # [PAD] must be id 0
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"  # how the server and clients must tokenize
IGNORE = -100  # MLM label of a position that is not predicted


def paddlenlp() -> Any:
    """Import paddlenlp 2.8.1 beside pyarrow >= 18: ``datasets<3`` (which paddlenlp imports)
    still names ``pyarrow.PyExtensionType``, removed in pyarrow 18 in favour of
    ``ExtensionType``; the alias is all it needs (docs/sentiment.md)."""
    import pyarrow

    if not hasattr(pyarrow, "PyExtensionType"):
        pyarrow.PyExtensionType = pyarrow.ExtensionType
    import paddlenlp.transformers  # noqa: F401  (the package, with its transformers)

    return paddlenlp.transformers


Positive = Annotated[int, Field(ge=1)]
Dropout = Annotated[float, Field(ge=0, lt=1)]  # within [0, 1)


@params_model
class ModelShape:
    """The ``ErnieConfig`` of the offline model (ignored with ``pretrained``)."""

    hidden_size: Positive = 128
    num_hidden_layers: Positive = 2
    num_attention_heads: Positive = 2
    intermediate_size: Positive = 512
    hidden_dropout_prob: Dropout = 0.1
    attention_probs_dropout_prob: Dropout = 0.1
    type_vocab_size: Positive = 4

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelShape:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        return self


@params_model
class MlmOptions:
    """Masked-language pretraining on the training texts before fine-tuning (0 epochs: off)."""

    epochs: Annotated[int, Field(ge=0)] = 0
    # of the real tokens; of those 80 % [MASK], 10 % random, 10 % kept
    mask_rate: Annotated[float, Field(gt=0, lt=1)] = 0.15
    learning_rate: Annotated[float, Field(gt=0)] = 0.0005
    batch_size: Positive = 64
    warmup_fraction: Dropout = 0.1
    seed: int = 42


@params_model
class DistillOptions:
    """Distil from the linear baseline while fine-tuning: its out-of-fold probabilities on
    the training texts (each text scored by a baseline that never saw it) are soft labels
    (weight 0: labels only)."""

    weight: Annotated[float, Field(ge=0, le=1)] = 0.0
    temperature: Annotated[float, Field(gt=0)] = 1.0
    folds: Annotated[int, Field(ge=2)] = 5
    seed: int = 42


@params_model
class SentimentOptions:
    pretrained: str | None = None  # paddlenlp name or save_pretrained directory
    # tokens including [CLS] and [SEP]; longer texts are truncated
    max_seq_len: Annotated[int, Field(ge=4)] = 64
    # what a long text keeps: its first tokens (head), or half its first and half its last
    # (head_tail: reviews often conclude at the end)
    truncation: Literal["head", "head_tail"] = "head"
    lowercase: bool = True  # ErnieTokenizer's do_lower_case
    vocab_min_count: Positive = 2  # offline vocabulary: characters seen at least this often ...
    # ... keeping the most frequent (special tokens included)
    vocab_max_size: Annotated[int, Field(gt=len(SPECIAL_TOKENS))] = 3000
    model: ModelShape = field(default_factory=ModelShape)
    mlm: MlmOptions = field(default_factory=MlmOptions)
    # of the fine-tuning steps: linear warmup, then linear decay
    warmup_fraction: Dropout = 0.1
    grad_clip: Annotated[float, Field(ge=0)] = 1.0  # global norm (0: off)
    # the linear baseline evaluate scores beside the model: character n-gram TF-IDF +
    # logistic regression; [min, max] with 1 <= min <= max
    baseline_ngrams: Annotated[list[Positive], Field(min_length=2, max_length=2)] = field(
        default_factory=lambda: [1, 2]
    )
    # inverse regularisation strength of the logistic regression
    baseline_c: Annotated[float, Field(gt=0)] = 1.0
    distill: DistillOptions = field(default_factory=DistillOptions)

    @model_validator(mode="after")
    def _ngrams_ordered(self) -> SentimentOptions:
        lo, hi = self.baseline_ngrams
        if lo > hi:
            raise ValueError(f"baseline_ngrams must be [min, max] with min <= max, got {[lo, hi]}")
        return self


class ErnieClassifier(nn.Layer):
    """``ErnieForSequenceClassification`` with the served signature: logits from
    ``(input_ids, token_type_ids)``."""

    def __init__(self, inner: nn.Layer):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: paddle.Tensor, token_type_ids: paddle.Tensor) -> paddle.Tensor:
        # without labels and return_dict, paddlenlp returns the logits tensor itself (no
        # type test here: under to_static the value is not a paddle.Tensor)
        return self.inner(input_ids=input_ids, token_type_ids=token_type_ids)


def build_vocab(texts: Iterable[str], lowercase: bool, min_count: int, max_size: int) -> list[str]:
    """A character-level WordPiece vocabulary of ``texts``: the special tokens, then every
    character ErnieTokenizer's basic tokenizer leaves alone (CJK characters, punctuation) and,
    for characters inside other words (Latin letters, digits), both ``c`` and ``##c``, so a
    word of known characters never becomes ``[UNK]``. Most frequent first; ties by code.
    ``texts`` may be a stream: only the character counts are kept."""
    paddlenlp()  # before any paddlenlp import
    from paddlenlp.transformers.bert.tokenizer import BasicTokenizer

    basic = BasicTokenizer(do_lower_case=lowercase)
    counts: Counter[str] = Counter()
    for text in tqdm(texts, desc="vocabulary", unit="text", leave=False):
        for token in basic.tokenize(text):
            counts[token[0]] += 1
            counts.update("##" + c for c in token[1:])
    ranked = sorted((t for t, n in counts.items() if n >= min_count), key=lambda t: (-counts[t], t))
    return SPECIAL_TOKENS + ranked[: max_size - len(SPECIAL_TOKENS)]


class SentimentTask(Task):
    name = "sentiment"
    data = TextData()
    # paddle 3.3 cannot save MultiHeadAttention as a legacy ProgramDesc (docs/sentiment.md):
    # OpenVINO (the server's runtime) reads the PIR program converted to ONNX instead
    export_formats = ("pir", "onnx")

    def __init__(self, options: SentimentOptions, where: str = "params.yaml: task.options"):
        self.options = options
        self.where = where
        self.tokenizer: Any = None  # set by fit_preprocessing or load_assets

    @classmethod
    def from_options(
        cls, options: dict[str, Any], *, where: str = "params.yaml: task.options"
    ) -> SentimentTask:
        return cls(from_dict(SentimentOptions, options, where=where), where)

    # ---------------------------------------------------------------- tokenizer (assets)

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise StepError(
                f"task {self.name}: no tokenizer yet (train builds it; later steps load it from "
                "the model's assets/ directory)"
            )
        return self.tokenizer

    def fit_preprocessing(
        self, data: TrainingData | np.ndarray, labels: np.ndarray | None = None
    ) -> None:
        """The tokenizer: the pretrained one, or a vocabulary of the training texts (read as a
        stream)."""
        transformers = paddlenlp()
        if self.options.pretrained:
            self.tokenizer = self._pretrained(transformers.ErnieTokenizer)
            return
        data = as_training_data(self, data, labels)
        vocab = build_vocab(
            (str(t) for batch in data.samples() for t in batch.samples.tolist()),
            self.options.lowercase,
            self.options.vocab_min_count,
            self.options.vocab_max_size,
        )
        import tempfile

        # the tokenizer keeps its vocab file's path (save_pretrained copies it): the file
        # lives as long as this task object
        self._vocab_dir = tempfile.TemporaryDirectory(prefix="vocab-")
        path = Path(self._vocab_dir.name) / VOCAB_FILE
        path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
        self.tokenizer = transformers.ErnieTokenizer(
            vocab_file=str(path), do_lower_case=self.options.lowercase
        )
        log.info("vocabulary: %d tokens from %d training texts", len(vocab), data.rows)

    def _pretrained(self, cls: Any, **kwargs: Any) -> Any:
        try:
            return cls.from_pretrained(self.options.pretrained, **kwargs)
        except Exception as exc:  # paddlenlp raises many types for a missing/offline model
            raise StepError(
                f"{self.where}.pretrained: cannot load '{self.options.pretrained}' "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "give a directory written by save_pretrained, or leave it out to build the "
                "model from task.options.model"
            ) from exc

    def save_assets(self, dest: Path) -> None:
        tok = self._require_tokenizer()
        dest.mkdir(parents=True, exist_ok=True)
        vocab = sorted(tok.vocab.token_to_idx.items(), key=lambda kv: kv[1])
        if [i for _, i in vocab] != list(range(len(vocab))):
            raise StepError("tokenizer vocabulary ids are not 0..N-1; cannot write vocab.txt")
        (dest / VOCAB_FILE).write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
        write_json(dest / TOKENIZER_FILE, self.tokenizer_doc())

    def load_assets(self, root: Path) -> None:
        """The tokenizer the model was trained with, and its settings: ``max_seq_len``,
        ``truncation`` and lower-casing come from the assets, not from the current params (a
        model exported with other settings is scored as it was trained)."""
        import dataclasses

        assets = Path(root) / ASSETS_DIR
        vocab = assets / VOCAB_FILE
        if not vocab.is_file():
            raise StepError(f"{vocab}: missing; the model directory has no tokenizer assets")
        doc = read_json(assets / TOKENIZER_FILE)
        try:
            self.options = dataclasses.replace(
                self.options,
                max_seq_len=int(doc["max_seq_len"]),
                truncation=str(doc["truncation"]),
                lowercase=bool(doc["do_lower_case"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StepError(
                f"{assets / TOKENIZER_FILE}: needs max_seq_len, truncation and do_lower_case "
                f"({exc})"
            ) from exc
        self.tokenizer = paddlenlp().ErnieTokenizer(
            vocab_file=str(vocab), do_lower_case=self.options.lowercase
        )
        if doc.get("no_split_tokens"):  # a published tokenizer keeps [CLS] etc. whole
            self.tokenizer.sanitize_special_tokens()

    def tokenizer_doc(self) -> dict[str, Any]:
        """``tokenizer.json``: what a client or the C++ server needs to tokenize exactly as
        ErnieTokenizer does: the settings, the special token ids, and the character tables
        of this Python's Unicode database (:func:`char_tables`)."""
        tok = self._require_tokenizer()
        return {
            "type": "ErnieTokenizer",
            "unicode_version": unicodedata.unidata_version,
            **char_tables(bool(tok.do_lower_case)),
            "vocab_file": VOCAB_FILE,
            "vocab_size": int(len(tok.vocab)),
            "do_lower_case": bool(tok.do_lower_case),
            "max_seq_len": self.options.max_seq_len,
            "padding": "max_length",
            "truncation": self.options.truncation,
            # written in a text, these stay one token (none for a vocabulary built here)
            "no_split_tokens": sorted(tok.unique_no_split_tokens),
            **{name: tok.vocab.token_to_idx[name] for name in SPECIAL_TOKENS},
        }

    # ---------------------------------------------------------------- model

    def _config(self, num_classes: int) -> Any:
        tok = self._require_tokenizer()
        shape = self.options.model
        return paddlenlp().ErnieConfig(
            vocab_size=len(tok.vocab),
            max_position_embeddings=max(512, self.options.max_seq_len),
            pad_token_id=tok.pad_token_id,
            num_labels=num_classes,
            **asdict(shape),
        )

    def build_model(self, num_classes: int) -> nn.Layer:
        transformers = paddlenlp()
        if self.options.pretrained:
            inner = self._pretrained(
                transformers.ErnieForSequenceClassification, num_classes=num_classes
            )
        else:
            inner = transformers.ErnieForSequenceClassification(self._config(num_classes))
        return ErnieClassifier(inner)

    def pretrain(self, model: nn.Layer, data: TrainingData) -> dict[str, Any]:
        """Masked-language pretraining of ``model``'s encoder on the training split, streamed:
        ``mlm.epochs`` passes of shuffled, length-bucketed batches (each pass seeded from
        ``(mlm.seed, pass)``, masks too)."""
        opts = self.options.mlm
        if opts.epochs == 0 or self.options.pretrained:
            return {}
        transformers = paddlenlp()
        tok = self._require_tokenizer()
        paddle.seed(opts.seed)
        mlm = transformers.ErnieForMaskedLM(self._config(2))
        mlm.ernie.set_state_dict(model.inner.ernie.state_dict())
        steps = opts.epochs * math.ceil(data.rows / opts.batch_size)
        scheduler, optimizer = adamw(mlm, opts.learning_rate, steps, opts.warmup_fraction, 1.0)
        special = np.asarray([tok.vocab.token_to_idx[t] for t in SPECIAL_TOKENS])
        vocab = len(tok.vocab)
        started, history = time.perf_counter(), []
        mlm.train()
        passes = data.epochs(opts.batch_size, (opts.seed,), opts.epochs)
        for epoch, batches in enumerate(passes, start=1):
            rng = np.random.default_rng([opts.seed, epoch])  # the masks
            total, count = 0.0, 0
            for item in tqdm(batches, desc=f"mlm {epoch}", leave=False):
                batch, batch_types = self.collate(item.inputs)
                masked, labels = mask_tokens(batch, rng, opts.mask_rate, special, vocab, tok)
                positions = np.flatnonzero(labels.reshape(-1) != IGNORE)
                if positions.size == 0:
                    continue
                # the LM head runs on the masked positions only (a [tokens, vocab] matmul
                # over every position would cost more than the encoder)
                logits = mlm(
                    input_ids=paddle.to_tensor(masked),
                    token_type_ids=paddle.to_tensor(batch_types),
                    masked_positions=paddle.to_tensor(positions),
                )
                logits = logits if isinstance(logits, paddle.Tensor) else logits[0]
                loss = F.cross_entropy(
                    logits.reshape([-1, vocab]),
                    paddle.to_tensor(labels.reshape(-1)[positions].reshape([-1, 1])),
                )
                loss.backward()
                optimizer.step()
                optimizer.clear_grad()
                scheduler.step()
                total, count = total + float(loss), count + 1
            history.append({"epoch": epoch, "mlm_loss": total / max(count, 1)})
            log.info("mlm epoch %d/%d: loss %.4f", epoch, opts.epochs, history[-1]["mlm_loss"])
        model.inner.ernie.set_state_dict(mlm.ernie.state_dict())
        return {
            "mlm_epochs": opts.epochs,
            "mlm_seconds": round(time.perf_counter() - started, 1),
            "mlm_final_loss": round(history[-1]["mlm_loss"], 4),
            "mlm_history": history,
        }

    def optimization(self, model: nn.Layer, settings: TrainSettings) -> Optimization:
        """AdamW (no decay on biases and norms), linear warmup then linear decay to 0 over
        every fine-tuning step, global-norm clipping; the schedule advances per batch."""
        steps = settings.epochs * settings.steps_per_epoch
        scheduler, optimizer = adamw(
            model,
            settings.learning_rate,
            steps,
            self.options.warmup_fraction,
            self.options.grad_clip,
            settings.weight_decay,
        )
        return Optimization(optimizer, scheduler, per_batch=True)

    def baseline(self) -> Any:
        """Character n-gram TF-IDF + logistic regression on the raw texts."""
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline

        lo, hi = self.options.baseline_ngrams
        return make_pipeline(
            TfidfVectorizer(
                analyzer="char",
                ngram_range=(lo, hi),
                lowercase=self.options.lowercase,
                sublinear_tf=True,
            ),
            LogisticRegression(C=self.options.baseline_c, max_iter=2000),
        )

    def soft_targets(self, data: TrainingData, num_classes: int) -> SoftTargets | None:
        """The baseline's out-of-fold class probabilities on the training texts, by sample
        key. The one part of training that holds the split's texts in memory: the linear
        baseline is fitted on all of them at once (scikit-learn); only with
        ``distill.weight`` > 0, and it says so in the log."""
        opts = self.options.distill
        if opts.weight == 0:
            return None
        from sklearn.model_selection import StratifiedKFold, cross_val_predict

        log.warning(
            "distill.weight %s: the distillation teacher holds the %d training texts in "
            "memory (a scikit-learn fit over all of them); the rest of training streams",
            opts.weight,
            data.rows,
        )
        started = time.perf_counter()
        texts: list[str] = []
        labels, keys = [], []
        for batch in data.samples():
            texts += [str(t) for t in batch.samples.tolist()]
            labels.append(batch.labels)
            keys.append(batch.keys)
        train_labels = np.concatenate(labels)
        folds = StratifiedKFold(opts.folds, shuffle=True, random_state=opts.seed)
        proba = cross_val_predict(
            self.baseline(), texts, train_labels, cv=folds, method="predict_proba"
        ).astype(np.float32)
        if proba.shape[1] != num_classes:
            raise StepError(
                f"{self.where}.distill: the baseline saw {proba.shape[1]} of {num_classes} "
                "classes in the training split"
            )
        accuracy = float((proba.argmax(axis=1) == train_labels).mean())
        log.info("distillation teacher (baseline, out of fold): accuracy %.4f", accuracy)
        return SoftTargets(
            proba,
            opts.weight,
            opts.temperature,
            {
                "teacher_oof_accuracy": round(accuracy, 6),
                "teacher_seconds": round(time.perf_counter() - started, 1),
            },
            keys=np.concatenate(keys),
        )

    def int8_blocker(self) -> str | None:
        """Measured (tests/test_sentiment.py keeps it true): the fake-quantized ERNIE trains,
        but Paddle 3.3's int8 save writes the legacy program format, and tracing paddlenlp's
        MultiHeadAttention into it fails ("matmul(): argument must be Value, but got
        Variable"), the same failure as the legacy fp32 export."""
        return (
            f"paddle {paddle.__version__} cannot save a quantized ERNIE: the int8 export "
            "writes the legacy program format, into which paddlenlp's MultiHeadAttention "
            "does not trace"
        )

    # ---------------------------------------------------------------- inputs

    def input_specs(self) -> list[TensorSpec]:
        n = self.options.max_seq_len
        return [
            TensorSpec("input_ids", (-1, n), "int64"),
            TensorSpec("token_type_ids", (-1, n), "int64"),
        ]

    def preprocess(self, raw: np.ndarray) -> list[np.ndarray]:
        tok = self._require_tokenizer()
        texts = [str(t) for t in np.asarray(raw, dtype=object).reshape(-1).tolist()]
        n = self.options.max_seq_len
        ids = np.zeros((len(texts), n), dtype=np.int64)
        types = np.zeros((len(texts), n), dtype=np.int64)
        items = tqdm(texts, desc="tokenize", unit="text", leave=False, disable=len(texts) < 2000)
        cls, sep = tok.cls_token_id, tok.sep_token_id
        for i, text in enumerate(items):
            row = [
                cls,
                *truncate(
                    tok.convert_tokens_to_ids(tok.tokenize(text)), n - 2, self.options.truncation
                ),
                sep,
            ]
            ids[i, : len(row)] = row
        return [ids, types]  # one segment: token_type_ids are 0

    def batches(
        self, inputs: list[np.ndarray], batch_size: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Length-bucketed: the block (shuffled samples from the stream's buffer) in a
        shuffled order cut into chunks of 50 batches, each chunk sorted by length, then the
        batches shuffled — batches of similar lengths, so that :meth:`collate` drops most of
        the padding."""
        ids = inputs[0]
        lengths = (ids != 0).sum(axis=1)
        order = rng.permutation(len(ids))
        out = []
        chunk = batch_size * 50
        for s in range(0, len(order), chunk):
            part = order[s : s + chunk]
            part = part[np.argsort(lengths[part], kind="stable")]
            out += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
        return [out[i] for i in rng.permutation(len(out))]

    def collate(self, batch: list[np.ndarray]) -> list[np.ndarray]:
        """Cut the columns that are padding ([PAD] = 0) in every sample: the logits do not
        change (the attention mask comes from the padding), the cost falls with the length."""
        width = max(1, int((batch[0] != 0).sum(axis=1).max()))
        return [x[:, :width] for x in batch]

    def monitor_features(self, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Token and length statistics of each text (:func:`token_features`), from the ids
        (the reference, a client that sends ids) or from raw texts as a text client sends
        them (the logged ``text`` input, tokenized here as the server does)."""
        x = inputs[0] if inputs else None
        if x is None:
            return {}
        if x.dtype == object or x.dtype.kind in "SU":
            texts = [
                t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
                for t in x.reshape(-1).tolist()
            ]
            x = self.preprocess(np.asarray(texts, dtype=object))[0]
        ids = self._require_tokenizer().vocab.token_to_idx
        special = [ids[t] for t in SPECIAL_TOKENS if t in ids]
        return token_features(x, special, ids.get("[UNK]", -1))

    def raw_samples(self, inputs: list[np.ndarray], like: Any) -> tuple[list[Any], np.ndarray]:
        """The texts a text client sent (the logged ``text`` input); logged token ids are not
        recovered (WordPiece does not give the text back)."""
        x = inputs[0] if inputs else np.zeros(0)
        if x.dtype == object or x.dtype.kind in "SU":
            texts: list[Any] = []
            for t in x.reshape(-1).tolist():
                try:
                    texts.append(t.decode("utf-8") if isinstance(t, bytes) else str(t))
                except UnicodeDecodeError:
                    texts.append(None)  # not UTF-8: not a text ingest would store
            return texts, np.array([t is not None for t in texts], dtype=bool)
        n = len(x)
        return [None] * n, np.zeros(n, dtype=bool)

    def preprocessing_doc(self) -> dict[str, Any]:
        return {
            "input_layout": "UTF-8 text, one string per sample (as stored by ingest)",
            "steps": [
                {
                    "op": "ErnieTokenizer",
                    "assets": [f"assets/{VOCAB_FILE}", f"assets/{TOKENIZER_FILE}"],
                    "max_seq_len": self.options.max_seq_len,
                    "padding": "max_length with [PAD] = 0",
                }
            ],
            "truncation": self.options.truncation,
            "paddle": (
                "ids = tok.convert_tokens_to_ids(tok.tokenize(text)) with tok = "
                "ErnieTokenizer(vocab_file='assets/vocab.txt'); keep "
                f"{self.options.max_seq_len - 2} ids ({self.options.truncation}); "
                "[CLS] + ids + [SEP], padded with 0 to "
                f"{self.options.max_seq_len}; token_type_ids all 0"
            ),
        }


# classes of char_tables' "char_classes" (any code point not listed is OTHER = 0)
CHAR_REMOVE, CHAR_SPACE, CHAR_CJK, CHAR_PUNCT = 1, 2, 3, 4


def char_tables(lowercase: bool) -> dict[str, Any]:
    """ErnieTokenizer's per-character decisions over all of Unicode, from paddlenlp's own
    predicates, so another implementation (the C++ server) needs no Unicode database:

    - ``char_classes``: ``[first, last, class]`` runs of code points that BasicTokenizer
      removes (NUL, U+FFFD, control characters), treats as white space (``_is_whitespace``, or
      ``str.split`` white space), surrounds with spaces (CJK ideographs) or splits off
      (punctuation and symbols);
    - with lower-casing, ``lower``: code point -> ``str.lower()`` of it (the whole text is
      lower-cased before BasicTokenizer sees it), and ``normalize``: code point -> what
      ``lower()``, NFD and dropping combining marks (Mn) make of it (each word, after the
      split on white space); both only for code points that change.
    """
    paddlenlp()  # before any paddlenlp import
    from paddlenlp.transformers.bert.tokenizer import BasicTokenizer
    from paddlenlp.transformers.tokenizer_utils import (
        _is_control,
        _is_punctuation,
        _is_symbol,
        _is_whitespace,
    )

    cjk = BasicTokenizer()._is_chinese_char
    runs: list[list[int]] = []
    lower: dict[str, str] = {}
    normalize: dict[str, str] = {}
    for cp in range(0x110000):
        ch = chr(cp)
        if cp in (0, 0xFFFD) or _is_control(ch):
            cls = CHAR_REMOVE
        elif _is_whitespace(ch) or ch.isspace():
            cls = CHAR_SPACE
        elif cjk(cp):
            cls = CHAR_CJK
        elif _is_punctuation(ch) or _is_symbol(ch):
            cls = CHAR_PUNCT
        else:
            cls = 0
        if cls and runs and runs[-1][1] == cp - 1 and runs[-1][2] == cls:
            runs[-1][1] = cp
        elif cls:
            runs.append([cp, cp, cls])
        if lowercase and ch.lower() != ch:
            lower[str(cp)] = ch.lower()
        if lowercase and cls in (0, CHAR_PUNCT, CHAR_CJK):
            folded = "".join(
                c
                for c in unicodedata.normalize("NFD", ch.lower())
                if unicodedata.category(c) != "Mn"
            )
            if folded != ch:
                normalize[str(cp)] = folded
    return {"char_classes": runs, "lower": lower, "normalize": normalize}


def truncate(ids: list[int], keep: int, how: str) -> list[int]:
    """At most ``keep`` token ids: the first ones (``head``), or the first ``keep // 2`` and
    the last ``keep - keep // 2`` (``head_tail``)."""
    if len(ids) <= keep:
        return ids
    if how == "head_tail":
        head = keep // 2
        return ids[:head] + ids[len(ids) - (keep - head) :]
    return ids[:keep]


def adamw(
    model: nn.Layer,
    learning_rate: float,
    steps: int,
    warmup_fraction: float,
    grad_clip: float,
    weight_decay: float = 0.01,
) -> tuple[paddle.optimizer.lr.LRScheduler, paddle.optimizer.Optimizer]:
    """AdamW with linear warmup over ``warmup_fraction`` of ``steps`` then linear decay to 0;
    biases and norm weights are not decayed."""
    steps = max(1, steps)
    warmup = int(steps * warmup_fraction)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    scheduler = paddle.optimizer.lr.LambdaDecay(learning_rate, factor)
    no_decay = {p.name for n, p in model.named_parameters() if "bias" in n or "norm" in n.lower()}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=scheduler,
        parameters=model.parameters(),
        weight_decay=weight_decay,
        apply_decay_param_fun=lambda name: name not in no_decay,
        grad_clip=nn.ClipGradByGlobalNorm(grad_clip) if grad_clip > 0 else None,
    )
    return scheduler, optimizer


def mask_tokens(
    ids: np.ndarray,
    rng: np.random.Generator,
    rate: float,
    special: np.ndarray,
    vocab_size: int,
    tok: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of real (non-special) tokens: ``rate`` of them are predicted; of those 80 %
    become [MASK], 10 % a random token, 10 % stay. Returns (inputs, labels)."""
    candidates = ~np.isin(ids, special)
    chosen = candidates & (rng.random(ids.shape) < rate)
    labels = np.where(chosen, ids, IGNORE)
    roll = rng.random(ids.shape)
    masked = ids.copy()
    masked[chosen & (roll < 0.8)] = tok.mask_token_id
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    masked[swap] = rng.integers(len(SPECIAL_TOKENS), vocab_size, size=int(swap.sum()))
    return masked, labels.astype(np.int64)
