"""`python -m bench.serving`: see docs/serving-benchmark.md."""

from bench.serving.cli import main

raise SystemExit(main())
