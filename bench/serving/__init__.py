"""The serving benchmark (docs/serving-benchmark.md): `python -m bench.serving`."""
