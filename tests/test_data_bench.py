"""The data benchmark (bench/data_bench.py, ``make bench-data``) as a smoke run on tiny image
folders: it completes, its last line is the machine-readable one, and the invariants it
checks hold: an incremental ingest (+10% new files in a dated sub-folder, into the same
output directory) keeps every shard of the old snapshot byte for byte and moves no old sample
to another split. Timing ratios are never asserted (benchmarks measure them, tests do not).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

LAST_LINE = re.compile(
    r"rss_growth_16x=(?P<rss_growth_16x>\S+) ingest_vs_decode=(?P<ingest_vs_decode>\S+) "
    r"reader_vs_train=(?P<reader_vs_train>\S+) incremental_ingest=(?P<incremental_ingest>\S+) "
    r"rerun_no_change=(?P<rerun_no_change>\S+) rss_100k_224_mb=(?P<rss_100k_224_mb>\S+) "
    r"train_vs_memory=(?P<train_vs_memory>\S+)"
)


def test_quick_run_prints_its_line_and_keeps_old_shards_and_splits(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "bench/data_bench.py", "--quick", "--sizes", "100", "200",
         "--steps", "ingest", "--workers", "1", "--repeats", "2", "--train-steps", "1",
         "--batch-size", "4", "--train-memory-epochs", "2", "--cache-dir", str(tmp_path / "cache"),
         "--json", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    line = LAST_LINE.fullmatch(proc.stdout.strip().splitlines()[-1])
    assert line, proc.stdout[-1000:]
    measured = ("rss_growth_16x", "ingest_vs_decode", "reader_vs_train", "incremental_ingest")
    for name in (*measured, "rerun_no_change", "train_vs_memory"):
        assert float(line[name]) > 0, name  # measured
    assert line["rss_100k_224_mb"] == "na"  # no --big

    doc = json.loads(report.read_text())
    assert set(doc["runs"]) == {"100", "200"}
    assert all(doc["runs"][n]["ingest"]["max_rss_mb"] > 0 for n in ("100", "200"))
    inc = doc["incremental"]
    assert inc["images_full"] == 200 and inc["images_added"] == 20  # 2 new per class
    # two rounds from scratch (--repeats): the ratios are medians, the checks hold in each
    assert inc["rounds"] == 2 and all(len(v) == 2 for v in inc["by_round"].values())
    assert min(inc["by_round"]["rerun_s"]) <= inc["rerun_s"] <= max(inc["by_round"]["rerun_s"])
    assert inc["old_shards"] > 0 and inc["old_shards_changed"] == []
    assert inc["shards_identical"] is True
    assert inc["old_samples_moved"] == {"train": 0, "val": 0, "test": 0}
    assert inc["splits_stable"] is True
    # the new dated folders are new units; every old unit kept its shards
    assert inc["units_reused"] == inc["units"] - 10
    assert inc["old_units_reread"] == 0
    # a rerun with nothing changed reuses every unit and writes the same snapshot.json
    assert inc["rerun_units_reused"] == inc["old_units"] and inc["rerun_identical"] is True
    # the train step reading shards vs in memory: digits and the 64x64 folder, 2 epochs each
    memory = doc["train_vs_memory"]
    assert set(memory["runs"]) == {"digits", "resnet18 64x64, 100 images"}
    for run in memory["runs"].values():
        assert run["epochs"] == 2 and run["stream"]["cache_mb"] > 0
        assert len(run["epoch_seconds"]["shards"]) == len(run["epoch_seconds"]["memory"]) == 2
