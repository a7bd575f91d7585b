"""The measurements made of several worker runs: ingest vs the bare decode loop (rounds,
alternating), and the incremental ingest (+10% new files into the same output directory) with
its checks that the old shards and splits are kept."""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.data.common import CLASSES, log
from bench.data.corpus import add_new_folder, link_folder
from bench.data.params import write_params
from bench.data.workers import call_worker


def ingest_vs_decode(
    source: Path, params: Path, scratch: Path, workers: int, repeats: int, chunk: int
) -> dict[str, Any]:
    """``repeats`` rounds of the bare decode loop then ingest, each in a fresh process, on
    ``source``: the median images/s of each and of their ratio (``ingest_vs_decode``)."""
    rounds = []
    for r in range(repeats):
        decode = call_worker("decode", str(source), str(workers), str(chunk))
        out = scratch / "ingest"
        if out.exists():
            shutil.rmtree(out)
        ingest = call_worker("ingest", str(params), str(out))
        if ingest["rows"] != decode["images"]:
            raise RuntimeError(
                f"ingest stored {ingest['rows']} images, the decode loop read {decode['images']}"
            )
        ratio = decode["seconds"] / ingest["seconds"]
        rounds.append(
            {"decode_s": decode["seconds"], "ingest_s": ingest["seconds"], "ratio": ratio}
        )
        log.info(
            "  round %d: decode %.2f s, ingest %.2f s (%d units, %d shards) -> %.2f",
            r + 1, decode["seconds"], ingest["seconds"], ingest["units"], ingest["shards"], ratio,
        )  # fmt: skip
    images = decode["images"]
    return {
        "images": images,
        "workers": workers,
        "rounds": rounds,
        "decode_images_per_s": images / statistics.median(x["decode_s"] for x in rounds),
        "ingest_images_per_s": images / statistics.median(x["ingest_s"] for x in rounds),
        "ingest_vs_decode": statistics.median(x["ratio"] for x in rounds),
    }


def _split_keys(data: Path) -> dict[str, set[bytes]]:
    """The sample keys of each split of the snapshot in ``data``."""
    from components.ml.data import snapshot

    return {s: set(snapshot.split_keys(data, [s]).tolist()) for s in snapshot.SPLITS}


def changed_shards(out: Path, old: dict[str, Any]) -> list[str]:
    """The shards of the ``old`` snapshot manifest that the snapshot now in ``out`` lost, or
    holds with another sha256, or whose bytes (hashed again) no longer match."""
    from components.core.artifacts import sha256_file

    new = json.loads((out / "snapshot.json").read_text())
    new_by_path = {s["path"]: s for s in new["shards"]}
    return [
        s["path"]
        for s in old["shards"]
        if s["path"] not in new_by_path
        or new_by_path[s["path"]]["sha256"] != s["sha256"]
        or sha256_file(out / s["path"]) != s["sha256"]
    ]


def incremental(
    gen: Path,
    scratch: Path,
    n: int,
    workers: int,
    batch: int,
    sets: Sequence[tuple[str, Any]],
    rounds: int = 1,
) -> dict[str, Any]:
    """``rounds`` times, from scratch: a full ingest of ``n`` images, a rerun with nothing
    changed, then +10% in a new dated folder into the same output. The ratios are the
    medians of the rounds' (a round's ratio rests on one full ingest, whose time varies from
    run to run); the checks must hold in every round."""
    runs = [_incremental_round(gen, scratch, n, workers, batch, sets) for _ in range(rounds)]
    median = {
        k: statistics.median(r[k] for r in runs)
        for k in ("full_s", "incremental_s", "incremental_ingest", "rerun_s", "rerun_no_change")
    }
    changed = sorted({path for r in runs for path in r["old_shards_changed"]})
    moved = {
        split: max(r["old_samples_moved"][split] for r in runs)
        for split in runs[0]["old_samples_moved"]
    }
    result = {
        **runs[-1],
        **median,
        "rounds": len(runs),
        "by_round": {k: [r[k] for r in runs] for k in ("full_s", "incremental_s", "rerun_s")},
        "rerun_units_reused": min(r["rerun_units_reused"] for r in runs),
        "rerun_identical": all(r["rerun_identical"] for r in runs),
        "old_units_reread": max(r["old_units_reread"] for r in runs),
        "units_reused": min(r["units_reused"] for r in runs),
        "old_shards_changed": changed,
        "old_samples_moved": moved,
        "shards_identical": not changed,
        "splits_stable": not any(moved.values()),
    }
    if rounds > 1:
        log.info(
            "  median of %d rounds: rerun %.3f, incremental %.3f",
            rounds, result["rerun_no_change"], result["incremental_ingest"],
        )  # fmt: skip
    return result


def _incremental_round(
    gen: Path, scratch: Path, n: int, workers: int, batch: int, sets: Sequence[tuple[str, Any]]
) -> dict[str, Any]:
    """One round of :func:`incremental`, in a fresh source folder and output directory."""
    from components.core.artifacts import sha256_file

    per_class, extra = n // len(CLASSES), max(1, n // len(CLASSES) // 10)
    folder = scratch / "source"
    if folder.exists():
        shutil.rmtree(folder)
    link_folder(folder, gen, per_class)
    params = write_params(
        scratch / "params.yaml", folder, image_size=64, workers=workers, batch_size=batch,
        sets=sets,
    )  # fmt: skip
    out = scratch / "ingest"
    if out.exists():
        shutil.rmtree(out)
    full = call_worker("ingest", str(params), str(out))
    first = (out / "snapshot.json").read_bytes()
    rerun = call_worker("ingest", str(params), str(out))  # nothing changed
    rerun_identical = (out / "snapshot.json").read_bytes() == first
    old = json.loads((out / "snapshot.json").read_text())
    for shard in old["shards"]:  # the old snapshot's bytes are what its manifest pins
        assert sha256_file(out / shard["path"]) == shard["sha256"], shard["path"]
    old_keys = _split_keys(out)
    add_new_folder(folder, gen, per_class, extra)
    inc = call_worker("ingest", str(params), str(out))
    changed = changed_shards(out, old)
    new_keys = _split_keys(out)
    moved = {
        split: len(keys - new_keys[split]) for split, keys in old_keys.items()
    }  # old samples no longer in their split
    added = inc["rows"] - full["rows"]
    result = {
        "images_full": full["rows"],
        "images_added": added,
        "full_s": full["seconds"],
        "incremental_s": inc["seconds"],
        "incremental_ingest": inc["seconds"] / full["seconds"],
        "rerun_s": rerun["seconds"],
        "rerun_no_change": rerun["seconds"] / full["seconds"],
        "rerun_units_reused": rerun["units_reused"],
        "rerun_identical": rerun_identical,
        "old_units": len(old["units"]),
        # the old units the growth made ingest read again (0: a new dated folder is new units)
        "old_units_reread": len(old["units"]) - inc["units_reused"],
        "units": inc["units"],
        "units_reused": inc["units_reused"],
        "old_shards": len(old["shards"]),
        "old_shards_changed": changed,
        "old_samples_moved": moved,
        "shards_identical": not changed,
        "splits_stable": not any(moved.values()),
    }
    log.info(
        "  full %.2f s (%d images); rerun, no change: %.2f s -> %.3f (%d/%d units reused); "
        "+%d images: %.2f s -> %.3f; %d/%d units reused; %d old shards, %d changed; old "
        "samples that left their split: %s",
        full["seconds"], full["rows"], rerun["seconds"], result["rerun_no_change"],
        rerun["units_reused"], len(old["units"]), added, inc["seconds"],
        result["incremental_ingest"], inc["units_reused"], inc["units"], len(old["shards"]),
        len(changed), moved,
    )  # fmt: skip
    if added != extra * len(CLASSES):
        raise RuntimeError(f"incremental ingest added {added} images, expected {extra * 10}")
    return result
