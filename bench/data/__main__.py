"""`python -m bench.data`: the data benchmark (as ``bench/data_bench.py``)."""

from bench.data.cli import main

raise SystemExit(main())
