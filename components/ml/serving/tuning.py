"""The serving-config search: which model config serves this bundle best on this machine.

Like Triton's Model Analyzer, but inside the pipeline: the real C++ server is started with a
candidate config (its settings flags over the bundle's ``model_config.json``), ``wrk`` drives it
with a closed-loop load of single-sample binary requests (the bundle's first warm-up sample) at
each of ``concurrencies``, the server is stopped, the next candidate runs. Within ``budget_s``:

1. **layouts** — workers x threads per worker (OpenVINO streams = workers, threads =
   workers x threads per worker); the written config's batching settings;
2. **batching** — on the best layout: batching off, and on with each ``max_batch_size`` x
   ``max_queue_delay_us`` (a max batch size is also the largest request the server accepts,
   so none below the written one: that is the clients' contract);
3. **finalists** — the best ``finalists`` configs (the written one always among them) are
   measured ``repeats`` more times, interleaved, then more whole rounds while the budget
   lasts, and the decision is each one's median score.
   One lucky sample cannot pick a config: a winner replaces the written config only when
   its worst round beats the written config's median.

Objectives: ``throughput`` — the geometric mean of requests/s over the concurrencies, among
configs whose p99 is within ``p99_budget_ms`` at every one (none is: the lowest worst p99
wins, and the result says so); ``latency`` — the lowest worst p99 over the concurrencies.

A stage that would overrun the budget (``budget_s``, or ``max_trials`` trials) stops at the last
candidate that fits (the estimate is the mean trial time so far); the search table says which
candidates ran.

**The CPUs here bound what may be searched and chosen.** Only layouts with workers x threads <=
the CPUs this process may use (affinity capped by a cgroup quota: a pod's CPU limit) are
searched, batched around, taken as finalists or chosen. The written layout always runs first;
when it needs more CPUs than that, it runs once as a *reference* (its score is what
``chosen_vs_written`` compares with) and nothing else: ``tune.json`` says ``written_fits: false``
and one warning names both counts. Listed layouts (``space.layouts``) that do not fit are
skipped and named in ``skipped_layouts``. One trial of a layout that fits always runs.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from tqdm import tqdm

from components.core.artifacts import StepError, read_json
from components.core.config import params_model
from components.ml.serving import warmup
from components.ml.serving.kserve_client import encode_request
from components.ml.serving.loadgen import LoadResult, Wrk
from components.ml.serving.model_config import ModelConfig
from components.ml.serving.server import RunningServer

log = logging.getLogger(__name__)

TUNE_FILE = "tune.json"


Counts = Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]  # each >= 1


@params_model
class TuneSpace:
    # "WxT": W workers with T threads each; null: every layout with W*T <= the CPUs here
    # (affinity, capped by a cgroup CPU limit)
    layouts: list[str] | None = None
    # also the largest request accepted: values below the written one are skipped
    max_batch_size: Counts = field(default_factory=lambda: [64])
    max_queue_delay_us: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] = field(
        default_factory=lambda: [0, 500]
    )

    @field_validator("layouts")
    @classmethod
    def _layouts_parse(cls, layouts: list[str] | None) -> list[str] | None:
        for text in layouts or []:
            parse_layout(text)
        return layouts


@params_model
class TuneParams:
    # wall seconds of the whole search; 0: no search
    budget_s: Annotated[float, Field(ge=0)] = 60.0
    # at most this many trials (server runs); 0: only budget_s bounds it
    max_trials: Annotated[int, Field(ge=0)] = 0
    objective: Literal["throughput", "latency"] = "throughput"
    # throughput: a config over it at any concurrency is out
    p99_budget_ms: Annotated[float, Field(gt=0)] = 50.0
    concurrencies: Counts = field(default_factory=lambda: [1, 16])
    # wrk seconds per concurrency per trial (wrk runs whole seconds)
    trial_s: Annotated[int, Field(ge=1)] = 1
    finalists: Annotated[int, Field(ge=1)] = 3
    repeats: Annotated[int, Field(ge=0)] = 2  # more rounds of the finalists
    variant: Literal["int8", "fp32"] = "int8"  # fp32 when the bundle has no int8
    space: TuneSpace = field(default_factory=TuneSpace)


def available_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup CPU quota (a pod's CPU
    limit shows all the node's CPUs in the affinity but runs only ``quota / period``)."""
    cpus = len(os.sched_getaffinity(0))
    for path, parse in (
        ("/sys/fs/cgroup/cpu.max", lambda t: t.split()),  # v2: "max 100000" | "200000 100000"
        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None),  # v1
    ):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if parse is not None:
            quota, period = parse(text)
        else:
            quota = text
            period = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text().strip()
        if quota not in ("max", "-1") and int(period) > 0:
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
        break
    return cpus


def cpu_model() -> str:
    """``/proc/cpuinfo``'s model name (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def parse_layout(text: str) -> tuple[int, int]:
    """``"2x1"`` → (2 workers, 1 thread each)."""
    try:
        workers, threads = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"layout {text!r}: expected WORKERSxTHREADS, e.g. 2x1") from None
    if workers < 1 or threads < 1:
        raise ValueError(f"layout {text!r}: workers and threads must be >= 1")
    return workers, threads


def layouts_for(cpus: int) -> list[tuple[int, int]]:
    """Every workers x threads with workers * threads <= ``cpus`` (each at least 1)."""
    return [(w, t) for w in range(1, cpus + 1) for t in range(1, cpus // w + 1)]


def layout_cpus(config: ModelConfig) -> int:
    """The CPUs a config's layout runs on: workers x threads per worker."""
    return config.workers * config.threads_per_worker


def config_key(config: ModelConfig) -> str:
    batching = (
        f"batch<={config.max_batch_size},delay {config.max_queue_delay_us}us"
        if config.dynamic_batching
        else "no batching"
    )
    return f"{config.workers}x{config.threads_per_worker} {batching}"


def server_flags(config: ModelConfig) -> list[str]:
    """The server's per-model flags for the searched settings (they override the file)."""
    return [
        f"--workers={config.workers}",
        f"--threads-per-worker={config.threads_per_worker}",
        f"--max-batch-size={config.max_batch_size}",
        f"--max-queue-delay-us={config.max_queue_delay_us}",
        f"--dynamic-batching={'true' if config.dynamic_batching else 'false'}",
    ]


def request_body(bundle: Path, work: Path) -> tuple[Path, int]:
    """A one-sample binary request made of the bundle's first warm-up sample (what a client
    sends: real, preprocessed model inputs): (file, JSON header length)."""
    inputs = warmup.read_first(bundle)
    payload, headers = encode_request(inputs, binary=True)
    path = work / "request.bin"
    path.write_bytes(payload)
    return path, int(headers["Inference-Header-Content-Length"])


@dataclass
class Trial:
    stage: str
    config: ModelConfig
    loads: list[LoadResult]
    seconds: float  # wall, server start to stop

    def worst_p99(self) -> float:
        return max(r.p99_ms for r in self.loads)

    def row(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "config": config_key(self.config),
            "settings": {k: getattr(self.config, k) for k in SEARCHED},
            "seconds": round(self.seconds, 2),
            "loads": [asdict(r) for r in self.loads],
        }


SEARCHED = (
    "workers",
    "threads_per_worker",
    "max_batch_size",
    "max_queue_delay_us",
    "dynamic_batching",
)


# ------------------------------------------------------------------ the rules (pure)


def score(trial: Trial, params: TuneParams) -> float:
    """Higher is better; a config with errors or over the p99 budget (throughput
    objective) scores below every config within it."""
    if any(r.errors for r in trial.loads) or any(r.requests == 0 for r in trial.loads):
        return -math.inf
    if params.objective == "latency":
        return -trial.worst_p99()
    geo = math.exp(statistics.fmean(math.log(r.throughput) for r in trial.loads))
    if trial.worst_p99() > params.p99_budget_ms:
        return -trial.worst_p99()  # below every feasible (positive) score
    return geo


def candidates_layouts(
    written: ModelConfig, space: TuneSpace, cpus: int
) -> tuple[list[ModelConfig], list[str]]:
    """The process layouts to try on ``cpus`` CPUs, the written one first (the baseline always
    runs, as a reference only when it does not fit), and the listed layouts skipped because
    they need more CPUs than ``cpus``: (configs, skipped ``"WxT"``)."""
    layouts = [parse_layout(t) for t in space.layouts] if space.layouts else layouts_for(cpus)
    first = (written.workers, written.threads_per_worker)
    skipped = [f"{w}x{t}" for w, t in layouts if w * t > cpus and (w, t) != first]
    layouts = [first] + [(w, t) for w, t in layouts if (w, t) != first and w * t <= cpus]
    configs = [dataclasses.replace(written, workers=w, threads_per_worker=t) for w, t in layouts]
    return configs, list(dict.fromkeys(skipped))


def candidates_batching(
    base: ModelConfig, written: ModelConfig, space: TuneSpace
) -> list[ModelConfig]:
    """Batching settings to try on the layout ``base``: distinct, in order, ``base`` left out."""
    out = [dataclasses.replace(base, dynamic_batching=not base.dynamic_batching)]
    # max_batch_size is also the largest request the server accepts: a client's contract,
    # never searched below what package.model_config promises
    for mb in [m for m in space.max_batch_size if m >= written.max_batch_size]:
        for delay in space.max_queue_delay_us:
            out.append(
                dataclasses.replace(
                    base, dynamic_batching=True, max_batch_size=mb, max_queue_delay_us=delay
                )
            )
    return [c for c in dict.fromkeys(out) if c != base]


def grid(written: ModelConfig, space: TuneSpace, cpus: int) -> list[ModelConfig]:
    """Every config of the space that fits ``cpus`` (each layout x every batching candidate):
    what the stages search a part of and may choose; the benchmark measures all of it."""
    layouts, _ = candidates_layouts(written, space, cpus)
    return [
        c
        for layout in layouts
        if layout_cpus(layout) <= cpus
        for c in [layout, *candidates_batching(layout, written, space)]
    ]


def decide(
    trials: Sequence[Trial],
    finalists: list[ModelConfig],
    written: ModelConfig,
    params: TuneParams,
) -> dict[str, Any]:
    """The finalist with the best median score over its rounds; the written config stays
    unless the winner's worst round beats the written config's median. ``finalists`` are
    configs the CPUs here can run (the written one only when it fits)."""
    rounds = {c: [score(t, params) for t in trials if t.config == c] for c in finalists}
    medians = {c: statistics.median(scores) for c, scores in rounds.items()}
    winner = max(finalists, key=lambda c: medians[c])
    written_rounds = rounds.get(written)
    kept_written = False
    if winner != written and written_rounds and len(rounds[winner]) > 1:
        if min(rounds[winner]) <= medians[written]:
            winner, kept_written = written, True
    feasible = medians[winner] > 0 if params.objective == "throughput" else True
    return {
        "chosen": winner,
        "kept_written": kept_written,
        "feasible": feasible,
        "finalists": [
            {
                "config": config_key(c),
                "median_score": medians[c],
                "scores": rounds[c],
                "written": c == written,
            }
            for c in finalists
        ],
    }


class Search:
    """One search over ``bundle`` served as ``variant`` by ``binary``."""

    def __init__(
        self,
        params: TuneParams,
        binary: Path,
        bundle: Path,
        variant: str,
        written: ModelConfig,
        work: Path,
        clock: Callable[[], float] = time.monotonic,
        cpus: int | None = None,
    ):
        self.params, self.binary, self.bundle, self.variant = params, binary, bundle, variant
        self.written, self.work, self.clock = written, work, clock
        self.cpus = available_cpus() if cpus is None else cpus
        self.wrk = Wrk(work)
        self.body, self.header_len = request_body(bundle, work)
        self.trials: list[Trial] = []
        self.start = clock()

    # ------------------------------------------------------------------ measuring

    def measure(self, stage: str, config: ModelConfig) -> Trial:
        t0 = self.clock()
        name = "tune"
        server = RunningServer(
            self.binary,
            self.bundle,
            self.variant,
            name,
            self.work / "server.log",
            extra_args=server_flags(config),
        )
        try:
            try:
                server.wait_ready(120.0)
            except StepError as exc:
                lines = (self.work / "server.log").read_text(errors="replace").splitlines()
                raise StepError(
                    f"tune: {config_key(config)}: {exc}: {lines[-1] if lines else ''}"
                ) from None
            url = f"http://127.0.0.1:{server.port}/v2/models/{name}/infer"
            loads = [
                self.wrk.closed_loop(url, self.body, self.header_len, c, self.params.trial_s)
                for c in self.params.concurrencies
            ]
        finally:
            server.stop()
        trial = Trial(stage, config, loads, self.clock() - t0)
        self.trials.append(trial)
        log.debug("tune %s %s: %s", stage, config_key(config), loads)
        return trial

    def score(self, trial: Trial) -> float:
        return score(trial, self.params)

    def left(self) -> float:
        return self.params.budget_s - (self.clock() - self.start)

    def fits(self) -> bool:
        """Another trial fits the budget (estimate: the mean trial so far)."""
        return self.fits_round(1)

    def fits_round(self, trials: int) -> bool:
        """``trials`` more trials fit the budget: ``max_trials``, and the time left (estimate:
        the mean trial so far)."""
        if self.params.max_trials and len(self.trials) + trials > self.params.max_trials:
            return False
        if not self.trials:
            return True
        return statistics.fmean(t.seconds for t in self.trials) * trials <= self.left()

    def runnable(self, config: ModelConfig) -> bool:
        """Its layout fits the CPUs here (a pod's CPU limit)."""
        return layout_cpus(config) <= self.cpus

    # ------------------------------------------------------------------ the search

    def candidates_layouts(self) -> tuple[list[ModelConfig], list[str]]:
        return candidates_layouts(self.written, self.params.space, self.cpus)

    def candidates_batching(self, base: ModelConfig) -> list[ModelConfig]:
        return candidates_batching(base, self.written, self.params.space)

    def grid(self) -> list[ModelConfig]:
        return grid(self.written, self.params.space, self.cpus)

    def run_stage(self, stage: str, configs: list[ModelConfig], bar: tqdm) -> None:
        for config in configs:
            if any(t.config == config for t in self.trials):
                continue
            # one trial of a runnable layout always runs: without it nothing can be chosen
            if not self.fits() and any(self.runnable(t.config) for t in self.trials):
                log.info("tune: budget reached in stage %s", stage)
                return
            self.measure(stage if self.runnable(config) else "reference", config)
            bar.update(1)

    def best(self) -> list[ModelConfig]:
        """Distinct configs this machine can run, by their best score, best first."""
        by_config: dict[ModelConfig, float] = {}
        for t in self.trials:
            if self.runnable(t.config):
                by_config[t.config] = max(by_config.get(t.config, -math.inf), self.score(t))
        return sorted(by_config, key=lambda c: by_config[c], reverse=True)

    def run(self) -> dict[str, Any]:
        p = self.params
        layouts, skipped = self.candidates_layouts()
        if not any(self.runnable(c) for c in layouts):
            raise StepError(
                f"package.tune.space.layouts: none of {p.space.layouts} fits the {self.cpus} "
                "CPUs this process may use (workers x threads per worker must be <= it)"
            )
        if not self.runnable(self.written):
            log.warning(
                "tune: the written layout %dx%d needs %d CPUs, this process may use %d: "
                "measured once as a reference; only layouts of <= %d CPUs are searched or chosen",
                self.written.workers,
                self.written.threads_per_worker,
                layout_cpus(self.written),
                self.cpus,
                self.cpus,
            )
        if skipped:
            log.warning(
                "tune: %d listed layouts need more than %d CPUs and are skipped: %s",
                len(skipped),
                self.cpus,
                ", ".join(skipped),
            )
        with tqdm(desc="tune", unit="trial", leave=False) as bar:
            self.run_stage("layout", layouts, bar)
            best_layout = self.best()[0]
            self.run_stage("batching", self.candidates_batching(best_layout), bar)
            finalists = self.best()[: p.finalists]
            if self.written not in finalists and self.written in self.best():
                finalists = [*finalists[: p.finalists - 1], self.written]
            rounds = 0
            # `repeats` rounds at least, then more whole rounds while the budget lasts: the
            # finalists are often within one round's noise of each other
            while rounds < p.repeats or self.fits_round(len(finalists)):
                for config in finalists:
                    if not self.fits():
                        break
                    self.measure("finalist", config)
                    bar.update(1)
                else:
                    rounds += 1
                    continue
                break
        return self.decide(finalists)

    def decide(self, finalists: list[ModelConfig]) -> dict[str, Any]:
        return decide(self.trials, finalists, self.written, self.params)


def tune(
    params: TuneParams,
    binary: Path,
    bundle: Path,
    written: ModelConfig,
    cpus: int | None = None,
) -> tuple[ModelConfig, dict[str, Any]]:
    """Search the config ``bundle`` is served best with on this machine (``cpus``: the CPUs
    it may use, default :func:`available_cpus`): (the chosen config, the search table for
    ``tune.json``)."""
    signature = read_json(bundle / "signature.json")
    has_int8 = "int8_openvino" in signature.get("formats", {})
    variant = params.variant if params.variant == "fp32" or has_int8 else "fp32"
    with tempfile.TemporaryDirectory(prefix="tune-") as work:
        search = Search(params, binary, bundle, variant, written, Path(work), cpus=cpus)
        decision = search.run()
        elapsed = search.clock() - search.start
    chosen: ModelConfig = decision.pop("chosen")
    unit = "requests/s (geometric mean)" if params.objective == "throughput" else "-p99 ms (worst)"
    # the written config's median over its rounds (a finalist's, or its reference run's)
    written_scores = [search.score(t) for t in search.trials if t.config == written]
    written_score = statistics.median(written_scores) if written_scores else None
    _, skipped = search.candidates_layouts()
    chosen_score = next(
        f["median_score"] for f in decision["finalists"] if f["config"] == config_key(chosen)
    )
    table = {
        "objective": params.objective,
        "score_unit": unit,
        "params": asdict(params),
        "variant": variant,
        "cpu": cpu_model(),
        "cpus": search.cpus,
        "elapsed_s": round(elapsed, 2),
        "trials": [t.row() for t in search.trials],
        "written": config_key(written),
        # false: the written layout needs more CPUs than this process may use; it ran once
        # as a reference (stage "reference") and could not be searched around or chosen
        "written_fits": search.runnable(written),
        "written_cpus": layout_cpus(written),
        "skipped_layouts": skipped,
        "chosen": config_key(chosen),
        "chosen_settings": {k: getattr(chosen, k) for k in SEARCHED},
        "chosen_score": chosen_score,
        "written_score": written_score,
        "chosen_vs_written": (
            chosen_score / written_score
            if written_score and written_score > 0 and chosen_score > 0
            else None
        ),
        **decision,
    }
    if not decision["feasible"]:
        log.warning(
            "tune: no config kept p99 within %.1f ms at every concurrency; chose the lowest p99",
            params.p99_budget_ms,
        )
    log.info(
        "tune: %d trials in %.1f s; chose %s (written: %s, chosen/written %s)",
        len(search.trials),
        elapsed,
        table["chosen"],
        table["written"],
        "-" if table["chosen_vs_written"] is None else f"{table['chosen_vs_written']:.3f}",
    )
    return chosen, table
