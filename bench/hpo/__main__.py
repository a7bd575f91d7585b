"""`python -m bench.hpo`: see docs/hpo.md, "The benchmark"."""

from bench.hpo.cli import main

raise SystemExit(main())
