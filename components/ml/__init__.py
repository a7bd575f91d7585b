"""Data and ML libraries: snapshots and datasets, sources, paired gates, scoring, the Paddle
and OpenVINO runtimes, model I/O, data-parallel launch. Import no step."""
