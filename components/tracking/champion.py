"""The challenger against the registered champion: what ``register``'s blessing measures.

Both versions are downloaded as registered (each bundle re-hashed against its
``bundle_sha256`` tag: :func:`components.tracking.registry.download_version`) and scored by the
same code as ``evaluate``, sample by sample (:func:`score_registered`), on the current split and
on the pinned holdout (:func:`check_holdout`: downloaded, then leak-checked). The champion is
scored only on samples outside its own training snapshot (its recorded training keys:
:func:`components.ml.decisions.blessing.clean_split`). The decision itself is
:func:`components.ml.decisions.blessing.bless`; :func:`record_blessing` writes it to the registry.

Library layer: imported by the register step, imports no step.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components.core.artifacts import read_json
from components.ml.data import dataset, snapshot
from components.ml.decisions import gates
from components.ml.decisions.blessing import (
    Blessing,
    Integrity,
    RegisterParams,
    check_leak,
    clean_split,
    too_few,
)
from components.tasks import Task
from components.tasks.base import Scores
from components.tasks.scoring import score_model
from components.tracking.registry import (
    CHAMPION,
    HOLDOUT_FORMAT,
    HOLDOUT_FORMAT_TAG,
    HOLDOUT_TAGS,
    TAG_LIMIT,
    Registry,
    download_version,
    fetch_holdout,
    fetch_training_keys,
)

log = logging.getLogger(__name__)

# what compare_with_champion returns: challenger, champion, paired counts per data set, the
# task's own rules, Integrity
Comparison = tuple[
    dict[str, Any], dict[str, Any] | None, dict[str, dict[str, Any]], dict[str, Any], Integrity
]


def score_registered(
    model_dir: Path, task: Task, data_dir: Path, split: str
) -> tuple[dict[str, Any], Scores]:
    """Score a downloaded model version exactly as ``evaluate`` does.

    Returns the summary kept in ``blessing.json`` (``accuracy``: the share of samples whose
    outcome is right, the task's ``outcome``; the task's metrics) and the scores (per-sample
    outcomes for the paired comparison with the other model on the same samples).
    """

    scores, _, _ = score_model(model_dir, task, data_dir, split)
    summary = {
        "accuracy": scores.report["accuracy"],
        "macro_f1": scores.report["macro_f1"],
        **{k: v for k, v in scores.metrics.items() if k not in ("accuracy", "macro_f1")},
        "inputs": _inputs(model_dir),
    }
    return summary, scores


def _inputs(model_dir: Path) -> Any:
    """The inputs a downloaded version's signature declares (None without a signature)."""
    sig_file = model_dir / "signature.json"
    return (read_json(sig_file) if sig_file.exists() else {}).get("inputs")


def check_holdout(
    client: Any,
    uri: str,
    model_tags: dict[str, str],
    data_dir: Path,
    split: str,
    split_sha: str,
    training_keys: np.ndarray,
    dest: Path,
    integrity: Integrity,
) -> Path | None:
    """The pinned holdout (``data_dir`` itself when its split is the pinned bytes), after the
    leak check: any of its samples among ``training_keys`` (the challenger's train + val) is a
    failure. None when nothing is pinned yet or the pin predates snapshots."""
    holdout = {t: model_tags[t] for t in HOLDOUT_TAGS if model_tags.get(t)}
    if len(holdout) != len(HOLDOUT_TAGS):
        integrity.leak = {"checked": False, "why": "no pinned holdout yet"}
        return None
    pinned_from = int(holdout["holdout_version"])
    if model_tags.get(HOLDOUT_FORMAT_TAG) != HOLDOUT_FORMAT:
        why = f"the pinned holdout (v{pinned_from}) was stored before data snapshots"
        integrity.leak = {"checked": False, "why": why, "pinned_from_version": pinned_from}
        integrity.failures.append(
            f"holdout leak check impossible: {why} and cannot be read; after review, promote "
            "with `paddle-mlops registry promote --force --reason TEXT`, which pins the new "
            "champion's test split"
        )
        return None
    if holdout["holdout_sha256"] == split_sha:  # the same shards: no download, their bytes
        h_dir = data_dir
        local = snapshot.load(data_dir)
        snapshot.verify(local, local.split_shards(split))
    else:
        h_dir = fetch_holdout(client, uri, holdout, dest, split)
    check_leak(integrity, h_dir, split, training_keys, pinned_from, data_dir)
    return h_dir


@dataclass
class _Match:
    """The two downloaded versions and what their comparison has found so far."""

    task: Task
    params: RegisterParams
    name: str
    challenger_dir: Path
    champion_dir: Path
    champion_version: int
    seen: np.ndarray  # the champion's training keys
    tmp: Path
    integrity: Integrity
    paired: dict[str, dict[str, Any]]


def compare_with_champion(
    client: Any,
    uri: str,
    registry: Registry,
    version: int,
    params: RegisterParams,
    task: Task,
    data_dir: Path,
    split_sha: str,
    training_keys: np.ndarray,
) -> Comparison:
    """Score the challenger and the champion (if any) as registered, sample by sample, on
    ``data_dir``'s split and on the pinned holdout: (challenger, champion, paired counts, the
    task's own rules on the split: ``failures`` and ``facts``, :class:`Integrity`).

    The challenger is refused if its training snapshot (``training_keys``) holds a sample of
    the pinned holdout. The champion is scored only on samples outside its own training
    snapshot (its recorded training keys): those are left out of both models' paired scores
    (:func:`clean_split`); a champion without recorded keys, or fewer than
    ``register.min_clean_samples`` left, is not compared and the blessing refused."""
    name = registry.name
    model_tags = client.get_registered_model(name).tags
    integrity = Integrity()
    paired: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        challenger_dir = download_version(client, uri, name, version, tmp / "c")
        challenger, c_scores = score_registered(challenger_dir, task, data_dir, params.split)
        challenger["version"] = version
        h_dir = check_holdout(
            client,
            uri,
            model_tags,
            data_dir,
            params.split,
            split_sha,
            training_keys,
            tmp / "h",
            integrity,
        )
        if integrity.leak.get("why") == "no pinned holdout yet":
            log.warning("%s has no pinned holdout yet: blessing on %s only", name, params.split)
        champion_version = registry.aliases().get(CHAMPION)
        if champion_version is None:
            return challenger, None, paired, {}, integrity
        champion_dir = download_version(client, uri, name, champion_version, tmp / "p")
        champion = {"version": champion_version, "inputs": _inputs(champion_dir)}
        seen = fetch_training_keys(client, uri, name, champion_version, tmp / "pk")
        if seen is None:
            _not_comparable(integrity, champion_version, version)
            return challenger, champion, paired, {}, integrity
        integrity.exclusions = {"vs_champion": champion_version}
        match = _Match(
            task,
            params,
            name,
            challenger_dir,
            champion_dir,
            champion_version,
            seen,
            tmp,
            integrity,
            paired,
        )
        champion, task_rules = _compare_on_split(match, data_dir, c_scores, champion)
        if h_dir is not None and champion["inputs"] == challenger["inputs"]:
            pin = {
                "pinned_from_version": int(model_tags.get("holdout_version") or 0),
                "sha256": model_tags.get("holdout_sha256", ""),
            }
            _compare_on_holdout(match, h_dir, data_dir, pin)
    return challenger, champion, paired, task_rules, integrity


def _not_comparable(integrity: Integrity, champion_version: int, version: int) -> None:
    """A champion without recorded training keys: refused, not compared."""
    integrity.exclusions = {
        "vs_champion": champion_version,
        "skipped": "no recorded training keys",
    }
    integrity.failures.append(
        f"champion v{champion_version} has no recorded training keys (registered "
        "before versions recorded their training snapshot): it cannot be scored only "
        "on samples it did not train on, so it is not compared; after review, promote "
        f"the challenger with `paddle-mlops registry promote --version {version} "
        "--force --reason TEXT` (champions registered from now on carry their keys)"
    )


def _clean(m: _Match, data: str, source: Path, where: str) -> tuple[Path, int, int] | None:
    """``source``'s split without the champion's training samples (in ``m.tmp/clean-<data>``),
    its counts recorded as ``m.integrity.exclusions[data]`` (``data``: "test" or "holdout"):
    (the clean directory, samples, excluded), or None when fewer than
    ``register.min_clean_samples`` are left (the failure recorded, naming ``where``)."""
    clean_dir, samples, excluded = clean_split(
        source, m.params.split, m.seen, m.tmp / f"clean-{data}"
    )
    m.integrity.exclusions[data] = {
        "samples": samples,
        "excluded": excluded,
        "scored": samples - excluded,
    }
    if samples - excluded < m.params.min_clean_samples:
        m.integrity.failures.append(too_few(where, samples, excluded, m.champion_version, m.params))
        return None
    return clean_dir, samples, excluded


def _compare_on_split(
    m: _Match, data_dir: Path, c_scores: Scores, champion: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both models on the split without the champion's training samples: (the champion's
    summary, the task's own rules), the counts in ``m.paired["test"]``."""
    split = m.params.split
    names = dataset.read_label_names(data_dir)
    cleaned = _clean(m, "test", data_dir, f"the {split} split")
    if cleaned is None:
        return champion, {}
    t_dir, samples, excluded = cleaned
    if excluded:
        log.info(
            "%s: %d of %d %s samples are in champion v%d's training snapshot: both "
            "models are compared on the other %d",
            m.name,
            excluded,
            samples,
            split,
            m.champion_version,
            samples - excluded,
        )
        _, c_clean = score_registered(m.challenger_dir, m.task, t_dir, split)
    else:
        c_clean = c_scores
    summary, p_scores = score_registered(m.champion_dir, m.task, t_dir, split)
    failures, facts = m.task.blessing_checks(c_clean, p_scores)
    m.paired["test"] = {
        **gates.compare(c_clean.y_true, p_scores.y_pred, c_clean.y_pred, names),
        "excluded": excluded,
    }
    return {**summary, "version": m.champion_version}, {"failures": failures, "facts": facts}


def _compare_on_holdout(m: _Match, h_dir: Path, data_dir: Path, pin: dict[str, Any]) -> None:
    """Both models on the pinned holdout ``h_dir`` without the champion's training samples
    (the split's counts when ``h_dir`` is the split itself), the counts in
    ``m.paired["holdout"]``."""
    if h_dir == data_dir:  # the same shards as the split: the same counts
        m.integrity.exclusions["holdout"] = m.integrity.exclusions["test"]
        if "test" in m.paired:
            m.paired["holdout"] = {**m.paired["test"], **pin}
        return
    split = m.params.split
    cleaned = _clean(m, "holdout", h_dir, f"the pinned holdout (v{pin['pinned_from_version']})")
    if cleaned is None:
        return
    hc_dir, _, h_excluded = cleaned
    h_names = dataset.read_label_names(hc_dir)
    _, h_champion = score_registered(m.champion_dir, m.task, hc_dir, split)
    _, h_challenger = score_registered(m.challenger_dir, m.task, hc_dir, split)
    m.paired["holdout"] = {
        **gates.compare(h_challenger.y_true, h_champion.y_pred, h_challenger.y_pred, h_names),
        "excluded": h_excluded,
        **pin,
    }


def record_blessing(client: Any, name: str, version: int, run_id: str, blessing: Blessing) -> None:
    """The decision on the version (tags ``blessed``, ``blessing_reasons``: the failed rules
    when refused, the met ones when blessed) and on ``run_id``, register's run (the same tags,
    metrics ``blessing.<data>.*``)."""
    why = "; ".join(blessing.why())[:TAG_LIMIT]
    for tag, value in (("blessed", str(blessing.blessed).lower()), ("blessing_reasons", why)):
        client.set_model_version_tag(name, str(version), tag, value)
        client.set_tag(run_id, tag, value)
    integrity = Integrity(**blessing.integrity) if blessing.integrity else Integrity()
    client.set_model_version_tag(name, str(version), "holdout_leak_check", integrity.leak_tag())
    if integrity.exclusions:
        client.set_model_version_tag(
            name,
            str(version),
            "champion_exclusions",
            json.dumps(integrity.exclusions, separators=(",", ":"))[:TAG_LIMIT],
        )
    if integrity.leak.get("checked"):
        client.log_metric(run_id, "blessing.holdout_leaked", float(integrity.leak["leaked"]))
    champion = blessing.champion
    for data, comparison in blessing.comparisons.items():
        o = comparison["overall"]
        summary = {
            "vs_champion": champion["version"] if champion else None,
            "samples": o["samples"],
            "excluded": comparison.get("excluded", 0),
            "worse": o["worse"],
            "better": o["better"],
            "p_value": round(o["p_value"], 6),
            "drop_points": round(o["drop_points"], 4),
            "passed": comparison["passed"],
        }
        client.set_model_version_tag(
            name, str(version), f"blessing_{data}", json.dumps(summary, separators=(",", ":"))
        )
        client.log_batch(
            run_id,
            metrics=[
                _metric(f"blessing.{data}.{k}", float(v))
                for k, v in summary.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            ],
        )
    client.log_metric(run_id, "blessed", float(blessing.blessed))


def _metric(key: str, value: float) -> Any:
    from mlflow.entities import Metric

    return Metric(key, value, int(time.time() * 1000), 0)
