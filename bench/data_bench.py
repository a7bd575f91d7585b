"""Data layer benchmark (``make bench-data``; docs/data-benchmark.md): the entry script of
:mod:`bench.data`, where the method, the options and the printed lines are described.

    .venv/bin/python bench/data_bench.py                # 2k/8k/32k (make bench-data)
    .venv/bin/python bench/data_bench.py --quick        # 500/2000 images: a CI smoke run
    .venv/bin/python bench/data_bench.py --big          # + 100k RGB 224x224
    .venv/bin/python bench/data_bench.py --set validate.workers=2 --json out.json
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.data.cli import main  # noqa: E402  (after the repo is importable)

if __name__ == "__main__":
    sys.exit(main())
