"""Holdout integrity against a real MLflow server: the pinned holdout as a snapshot, the leak
check on a challenger's training snapshot, and a champion scored only on samples it did not
train on (issue 26).

The situations are built from the real digits source ingested with other split rules: the
same hash rule with a wider test split (part of the champion's val samples land in the new
test split), and the old seeded permutation (part of the pinned holdout lands in train/val).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from components.core.artifacts import StepError, read_json, write_json
from components.ml.data import snapshot
from components.steps.register import RegisterParams
from components.tracking.registry import CHAMPION, HOLDOUT_TAGS, fetch_holdout
from tests.test_registry import register, registry

TRAINING = ["train", "val"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """A real ``mlflow server`` whose artifact store (a local directory) the tests can read."""
    from pipelines.containers import mlflow_server

    root = tmp_path_factory.mktemp("mlflow-holdout")
    with mlflow_server(root) as uri:
        yield SimpleNamespace(uri=uri, artifacts=root / "mlartifacts")


def ingest_digits(root: Path, **split: object) -> Path:
    from components.steps.ingest import IngestParams, SplitParams, run
    from components.tasks import get_task

    out = root / "ingest"
    params = IngestParams(source="builtin:digits", kind="builtin", split=SplitParams(**split))
    run(params, get_task("digits"), out)
    return out


@pytest.fixture(scope="module")
def wider_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hash rule with test_fraction 0.25: the old test split stays test, part of the old
    val split (what the champion saw while it was made) becomes test."""
    return ingest_digits(tmp_path_factory.mktemp("wider"), test_fraction=0.25)


@pytest.fixture(scope="module")
def permuted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The old seeded permutation: most of the hash rule's test split lands in train/val."""
    return ingest_digits(tmp_path_factory.mktemp("permuted"), method="permutation")


def stream_keys(data_dir: Path, split: str) -> np.ndarray:
    """The keys of ``split`` in the order the scoring code reads its samples."""
    batches = snapshot.iter_batches(data_dir, split, columns=["key"])
    return np.concatenate([np.asarray(b.column("key").to_pylist(), dtype="S32") for b in batches])


def test_a_challenger_trained_on_a_holdout_sample_is_refused(
    store, tmp_path, exported, digits_task, digits_data, permuted, caplog
):
    name = "leak-classifier"
    first = register(store.uri, tmp_path / "1", exported, digits_task, digits_data, name=name)
    assert first.promoted
    holdout = snapshot.split_keys(digits_data, ["test"])
    leaked = int(np.isin(holdout, snapshot.split_keys(permuted, TRAINING)).sum())
    assert 0 < leaked < holdout.size

    with caplog.at_level(logging.WARNING, logger="components.steps.register"):
        second = register(store.uri, tmp_path / "2", exported, digits_task, permuted, name=name)
    assert not second.blessing.blessed and not second.promoted
    lines = [r for r in second.blessing.reasons if r.startswith("holdout leak")]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith(
        f"holdout leak: {leaked} of {holdout.size} samples of the pinned holdout (v1) are in "
        f"the challenger's training snapshot (train/val of {permuted}); re-ingest with a split "
        "rule that keeps them out (the holdout was split by "
    )
    assert "method hash" in lines[0]
    assert f"  - {lines[0]}" in caplog.text  # the step's log says why
    reg = registry(store.uri, name)
    tags = reg.version(second.version).tags
    assert tags["blessed"] == "false"
    assert tags["holdout_leak_check"] == (
        f"failed: {leaked} of {holdout.size} samples of the pinned holdout (v1) in the "
        "training snapshot (train/val)"
    )
    leak = read_json(tmp_path / "2" / "out" / "blessing.json")["integrity"]["leak"]
    assert leak == {
        "checked": True,
        "pinned_from_version": 1,
        "holdout_samples": int(holdout.size),
        "leaked": leaked,
    }
    assert reg.aliases()[CHAMPION] == first.version
    # the champion passed the check on its own data set
    assert reg.version(first.version).tags["holdout_leak_check"].startswith("not checked")


def test_the_champion_is_scored_only_on_samples_it_did_not_train_on(
    store, tmp_path, exported, digits_task, digits_data, wider_test
):
    from components.tasks.scoring import score_model

    name = "clean-classifier"
    first = register(store.uri, tmp_path / "1", exported, digits_task, digits_data, name=name)
    assert first.promoted
    keys = stream_keys(wider_test, "test")
    seen = np.isin(keys, snapshot.split_keys(digits_data, TRAINING))
    samples, excluded = int(keys.size), int(seen.sum())
    clean = samples - excluded
    assert 0 < excluded and clean >= RegisterParams().min_clean_samples

    second = register(
        store.uri, tmp_path / "2", exported, digits_task, wider_test, name=name, auto_promote=False
    )
    assert second.blessing.blessed, second.blessing.reasons  # the same model: no regression
    blessing = read_json(tmp_path / "2" / "out" / "blessing.json")
    holdout_rows = snapshot.load(digits_data).rows("test")
    exclusions = blessing["integrity"]["exclusions"]
    assert exclusions == {
        "vs_champion": 1,
        "test": {"samples": samples, "excluded": excluded, "scored": clean},
        "holdout": {"samples": holdout_rows, "excluded": 0, "scored": holdout_rows},
    }
    assert blessing["integrity"]["leak"]["leaked"] == 0
    on_test = blessing["comparisons"]["test"]
    assert on_test["excluded"] == excluded and on_test["overall"]["samples"] == clean
    assert blessing["comparisons"]["holdout"]["overall"]["samples"] == holdout_rows

    # the champion's numbers are its numbers on exactly the samples it did not train on
    scores = score_model(exported, digits_task, wider_test, "test")[0]
    right = scores.y_pred == scores.y_true
    assert blessing["champion"]["accuracy"] == pytest.approx(float(right[~seen].mean()))
    assert on_test["overall"]["reference"] == pytest.approx(float(right[~seen].mean()))
    # the challenger's own accuracy stays the whole split's (its test samples are all unseen)
    assert blessing["challenger"]["accuracy"] == pytest.approx(float(right.mean()))

    tags = registry(store.uri, name).version(second.version).tags
    assert json.loads(tags["champion_exclusions"]) == exclusions
    assert json.loads(tags["blessing_test"])["excluded"] == excluded
    assert tags["holdout_leak_check"].startswith(f"passed: 0 of {holdout_rows} samples")

    # too few samples left to compare: refused, not compared on contaminated numbers
    strict = RegisterParams(min_accuracy=0.5, min_clean_samples=clean + 1)
    third = register(
        store.uri,
        tmp_path / "3",
        exported,
        digits_task,
        wider_test,
        params=strict,
        name=name,
        auto_promote=False,
    )
    assert not third.blessing.blessed
    assert (
        f"only {clean} of {samples} samples of the test split are outside champion v1's "
        f"training snapshot ({excluded} it trained on left out), fewer than "
        f"register.min_clean_samples {clean + 1}: not compared on contaminated numbers"
    ) in "\n".join(third.blessing.reasons)
    assert "test" not in read_json(tmp_path / "3" / "out" / "blessing.json")["comparisons"]


def test_a_champion_registered_before_training_keys_is_not_compared(
    store, tmp_path, exported, digits_task, digits_data
):
    """The upgrade: the champion and its pin predate snapshots. The first challenger is
    refused with what to do; the forced promotion it names pins a snapshot holdout, and from
    then on blessings compare again."""
    name = "upgraded-classifier"
    first = register(store.uri, tmp_path / "1", exported, digits_task, digits_data, name=name)
    assert first.promoted
    reg = registry(store.uri, name)
    # what a champion and a pin made before this change look like
    reg.client.delete_model_version_tag(name, str(first.version), "training_keys_sha256")
    reg.client.delete_registered_model_tag(name, "holdout_format")

    second = register(
        store.uri, tmp_path / "2", exported, digits_task, digits_data, name=name, auto_promote=False
    )
    assert not second.blessing.blessed
    reasons = second.blessing.reasons
    assert (
        f"champion v1 has no recorded training keys (registered before versions recorded their "
        "training snapshot): it cannot be scored only on samples it did not train on, so it is "
        f"not compared; after review, promote the challenger with `paddle-mlops registry "
        f"promote --version {second.version} --force --reason TEXT`"
    ) in "\n".join(reasons)
    assert any(
        r.startswith("holdout leak check impossible: the pinned holdout (v1)") for r in reasons
    )
    blessing = read_json(tmp_path / "2" / "out" / "blessing.json")
    assert blessing["comparisons"] == {} and "accuracy" not in blessing["champion"]
    tags = reg.version(second.version).tags
    assert json.loads(tags["champion_exclusions"])["skipped"] == "no recorded training keys"

    reg.promote(second.version, force=True, reason="reviewed: first model with training keys")
    model_tags = reg.client.get_registered_model(name).tags
    assert model_tags["holdout_version"] == str(second.version)
    assert model_tags["holdout_format"] == "snapshot"
    assert "v1 (sha256" in model_tags["holdout_replaced"]

    third = register(
        store.uri, tmp_path / "3", exported, digits_task, digits_data, name=name, auto_promote=False
    )
    assert third.blessing.blessed, third.blessing.reasons
    assert set(read_json(tmp_path / "3" / "out" / "blessing.json")["comparisons"]) == {
        "test",
        "holdout",
    }


def test_the_pinned_holdout_round_trips_and_a_changed_shard_is_refused(
    store, tmp_path, exported, digits_task, digits_data, wider_test
):
    name = "pin-classifier"
    first = register(store.uri, tmp_path / "1", exported, digits_task, digits_data, name=name)
    assert first.promoted
    reg = registry(store.uri, name)
    model_tags = reg.client.get_registered_model(name).tags
    data = snapshot.load(digits_data)
    assert model_tags["holdout_sha256"] == data.split_sha256("test")
    assert reg.version(first.version).tags["test_split_sha256"] == data.split_sha256("test")
    pin = {t: model_tags[t] for t in HOLDOUT_TAGS}
    test_keys = snapshot.split_keys(digits_data, ["test"])

    local = fetch_holdout(reg.client, store.uri, pin, tmp_path / "h1", "test")
    held = snapshot.load(local)
    assert {s.split for s in held.shards} == {"test"} and held.rows("test") == data.rows("test")
    assert np.array_equal(snapshot.split_keys(held, ["test"]), test_keys)
    # read as another split name (register.split changed since the pin)
    as_val = fetch_holdout(reg.client, store.uri, pin, tmp_path / "h2", "val")
    assert np.array_equal(snapshot.split_keys(as_val, ["val"]), test_keys)

    run_id = reg.version(first.version).run_id
    stored = [p for p in store.artifacts.rglob("holdout/shards/*.parquet") if run_id in p.parts]
    assert len(stored) == len(held.shards) >= 1
    shard, original = stored[0], stored[0].read_bytes()
    rel = f"shards/{shard.name}"
    try:
        changed = bytearray(original)
        changed[len(changed) // 2] ^= 0xFF
        shard.write_bytes(bytes(changed))
        with pytest.raises(StepError) as caught:
            fetch_holdout(reg.client, store.uri, pin, tmp_path / "h3", "test")
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(f"pinned holdout of v1 at {pin['holdout_uri']}: shard {rel}")
        assert "changed after it was pinned" in message
        # a challenger on other data downloads the holdout: the blessing stops at it
        with pytest.raises(StepError, match=f"shard {rel} has sha256"):
            register(store.uri, tmp_path / "2", exported, digits_task, wider_test, name=name)
    finally:
        shard.write_bytes(original)

    # a manifest rewritten to match changed shards no longer matches the pin
    manifest = shard.parent.parent / "snapshot.json"
    doc, original = read_json(manifest), manifest.read_bytes()
    try:
        shards = [{**doc["shards"][0], "sha256": "1" * 64}, *doc["shards"][1:]]
        write_json(manifest, {**doc, "shards": shards})
        with pytest.raises(StepError, match="not the pinned .* it was changed after it was pinned"):
            fetch_holdout(reg.client, store.uri, pin, tmp_path / "h4", "test")
    finally:
        manifest.write_bytes(original)
    assert snapshot.load(fetch_holdout(reg.client, store.uri, pin, tmp_path / "h5", "test"))
