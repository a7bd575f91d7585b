"""The command line's options, as a table: ``python -m bench.serving --help`` lists them in
this order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.serving.common import DEFAULT_BINARY, DEFAULT_DIGITS, PARTS, REPO

# every option of `python -m bench.serving`, in --help's order: (flags, add_argument's keywords)
OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--arch",), dict(default="resnet18", choices=["resnet18", "resnet34", "resnet50"])),
    (("--server-binary",), dict(type=Path, default=DEFAULT_BINARY)),
    (("--digits-dir",), dict(type=Path, default=DEFAULT_DIGITS)),
    (("--threads",), dict(type=int, default=2, help="total inference threads")),
    (
        ("--layouts",),
        dict(
            default=None,
            help="C++ worker layouts for the compute-bound regime, e.g. '1x2,2x1' (workers x "
            "threads per worker, each adding up to --threads); default: all of them",
        ),
    ),
    (("--digits-layout",), dict(default="1x1", help="workers x threads for both digits servers")),
    (("--concurrency",), dict(type=int, nargs="+", default=[1, 4, 16])),
    (
        ("--digits-concurrency",),
        dict(
            type=int,
            nargs="+",
            default=[1, 4, 16],
            help="digits: batching on vs off, and the Python baseline",
        ),
    ),
    (("--overhead-concurrency",), dict(type=int, default=16, help="of ratio_vs_python")),
    (
        ("--grpc-concurrency",),
        dict(
            type=int,
            nargs="+",
            default=[16, 1],
            help="digits, batching off: gRPC (h2load) vs REST binary (wrk)",
        ),
    ),
    (
        ("--slow-clients",),
        dict(
            type=int,
            default=1000,
            help="connections the slow-clients helper holds (0: no slow-clients cell)",
        ),
    ),
    (
        ("--slow-idle-fraction",),
        dict(type=float, default=0.5, help="of them silent, the rest trickle"),
    ),
    (
        ("--slow-interval-ms",),
        dict(type=float, default=500.0, help="between trickled header bytes"),
    ),
    (
        ("--slow-duration",),
        dict(
            type=int, default=12, help="seconds of the good clients' timed run among slow clients"
        ),
    ),
    (("--slow-concurrency",), dict(type=int, default=16, help="good clients (wrk connections)")),
    (
        ("--log-concurrency",),
        dict(
            type=int,
            default=16,
            help="digits, batching off: the prediction log's cost (no log / outputs / inputs 0.1)",
        ),
    ),
    (("--max-batch-size",), dict(type=int, default=16, help="digits servers")),
    (
        ("--warm-batches",),
        dict(
            type=int,
            nargs="+",
            default=[1, 3, 8, 16],
            help="warmup: the batch sizes whose first request after a swap is timed",
        ),
    ),
    (("--warm-rounds",), dict(type=int, default=6, help="warmup: swaps of each kind")),
    (
        ("--warm-repeats",),
        dict(type=int, default=25, help="warmup: requests per size for the median"),
    ),
    (
        ("--resnet-max-batch-size",),
        dict(
            type=int,
            default=8,
            help="ResNet servers (8: at concurrency 16 one batch runs while the next one's "
            "requests arrive)",
        ),
    ),
    (
        ("--queue-delay-us",),
        dict(
            type=int,
            default=20000,
            help="ResNet, batching on: the longest a free worker waits for answered clients to "
            "come back (server default 0: never waits)",
        ),
    ),
    (
        ("--digits-queue-delay-us",),
        dict(type=int, default=0, help="digits, batching on (server default 0)"),
    ),
    (
        ("--tune-bundle",),
        dict(
            type=Path,
            default=REPO / "outputs" / "package",
            help="tune: the digits bundle package wrote (int8 and warm-up samples)",
        ),
    ),
    (("--tune-rounds",), dict(type=int, default=3, help="tune: rounds of the grid")),
    (
        ("--tune-trial-seconds",),
        dict(type=int, default=2, help="tune: wrk seconds per concurrency of each grid cell"),
    ),
    (("--inprocess-batches",), dict(type=int, nargs="+", default=[1, 16, 32])),
    (
        ("--runtime-streams",),
        dict(
            nargs="+",
            default=["1", "2", "AUTO"],
            help="NUM_STREAMS searched for OpenVINO's best (THROUGHPUT hint, async requests)",
        ),
    ),
    (("--runtime-batches",), dict(type=int, nargs="+", default=[1, 16, 32])),
    (("--duration",), dict(type=int, default=4, help="seconds per timed cell")),
    (
        ("--repeats",),
        dict(
            type=int,
            default=5,
            help="digits: rounds of the compared servers (each measured in turn at each "
            "concurrency); medians and paired ratios are reported",
        ),
    ),
    (
        ("--compute-rounds",),
        dict(
            type=int,
            default=8,
            help="ResNet: rounds of the best server cell vs the best in-process batch, in turn",
        ),
    ),
    (
        ("--compute-candidates",),
        dict(
            type=int,
            default=3,
            help="ResNet: how many of the table's best server cells the rounds measure (the "
            "best median ratio is the verdict; every candidate's is printed)",
        ),
    ),
    (
        ("--compute-round-seconds",),
        dict(
            type=int,
            default=6,
            help="ResNet: seconds of each side of a round (short: the machine's slow phases "
            "then hit both sides of a pair; not too short: whole batches of 16 finish in it)",
        ),
    ),
    (
        ("--cpu-pinning",),
        dict(
            action="store_true",
            help="OpenVINO CPU pinning for every runtime (C++ server, Python baseline, "
            "in-process); default off, like the server",
        ),
    ),
    (("--warmup",), dict(type=int, default=1, help="seconds of warm-up per cell")),
    (("--inprocess-seconds",), dict(type=float, default=5.0)),
    (
        ("--noise-threshold",),
        dict(
            type=float,
            default=25.0,
            help="CPU %% of other processes (100 = one core) above which a cell is measured again",
        ),
    ),
    (("--retries",), dict(type=int, default=2, help="re-measurements of a noisy cell")),
    (("--startup-timeout",), dict(type=float, default=120.0)),
    (
        ("--server-arg",),
        dict(
            dest="server_args",
            action="append",
            default=[],
            help="extra flag for every C++ server run (repeatable), e.g. "
            "--server-arg=--http-threads=8",
        ),
    ),
    (
        ("--wait-for-binary",),
        dict(type=float, default=0.0, help="seconds to wait for the server binary"),
    ),
    (
        ("--only",),
        dict(
            action="append",
            choices=[*PARTS, "digits"],
            help="run only these parts (repeatable): resnet, batching, python, grpc, slow-clients, "
            "prediction-log, warmup, tune, or digits (all but resnet); default: everything",
        ),
    ),
    (("--quick",), dict(action="store_true", help="short cells, fewer of them")),
    (("--skip-cpp",), dict(action="store_true", help="no C++ server (development)")),
    (("--work-dir",), dict(type=Path, help="keep model, requests and logs here")),
    (("--json",), dict(type=Path, help="also write the results here")),
)
