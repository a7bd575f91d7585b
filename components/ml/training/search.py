"""The local search engine: an Optuna study whose trials are processes on this machine.

- **Study.** A journal file (``JournalStorage`` + ``JournalFileBackend``) under the study
  directory: an append-only log a killed driver leaves consistent. Never MLflow's database
  (both version their schema in the same ``alembic_version`` table).
- **One driver.** An exclusive ``fcntl`` lock on ``<dir>/driver.lock``; so on start every
  RUNNING trial is a dead one (the journal has no heartbeat): it is told FAIL (user attr
  ``stale``) and its params are enqueued again (``retry_of``). Finished trials are never
  repeated: the budget counts COMPLETE + PRUNED + FAIL trials, stale ones excepted.
- **Trial 0** re-runs the current params (the keys of the space they fall in), enqueued when
  the study is new.
- **Trials.** ``budget.parallel`` threads, each owning one subprocess at a time (the caller's
  argv builder: the train step's command with ``--set`` args), started in its own session
  with ``PADDLE_MLOPS_TRIAL=1``. Its stdout lines are parsed as metric lines
  (:mod:`components.ml.training.trial_metrics`); each epoch's objective is reported to the
  pruner, and a pruned trial's process group gets SIGTERM. A non-zero exit is a FAIL with the
  stderr tail in user attr ``error``; past ``budget.max_fail_fraction`` of the finished trials
  (after ``MIN_FINISHED`` of them) the search stops with one error line.
- **Budget.** ``budget.trials`` finished trials, and ``budget.wall_s`` seconds over all
  driver runs (study user attr ``elapsed_s``), measured on an injected
  :class:`~components.core.retry.Clock`; a trial still running at the deadline is stopped
  (FAIL, ``timeout``).

ML layer: knows no task and no step; the caller builds the argv and names the objective.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from components.core import children
from components.core.artifacts import StepError
from components.core.config import params_model, params_sha256
from components.core.retry import SYSTEM_CLOCK, Clock
from components.ml.training import search_space, trial_metrics
from components.ml.training.search_space import Space
from components.ml.training.trial_metrics import TRIAL_ENV

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

JOURNAL = "journal.log"
LOCK = "driver.lock"
MIN_FINISHED = 3  # the fail share is checked once this many trials finished
STDERR_TAIL = 20  # lines of a failed trial's stderr kept in its ``error``
TERM_GRACE_S = 10.0  # a stopped trial's group gets SIGKILL when SIGTERM has not ended it by then
WATCH_S = 1.0  # how often a running trial is checked against the wall budget


@params_model
class BudgetParams:
    """``hpo.budget``: finished trials, wall seconds (over all driver runs), trials at once,
    CPUs per trial, and the largest share of failed trials the search goes on with."""

    trials: Annotated[int, Field(ge=1)] = 16
    wall_s: Annotated[float, Field(gt=0)] = 3600.0
    parallel: Annotated[int, Field(ge=1)] = 1
    cpus_per_trial: Annotated[int, Field(ge=1)] = 2
    max_fail_fraction: Annotated[float, Field(ge=0, le=1)] = 0.5


@params_model
class SamplerParams:
    """``hpo.sampler``: TPE (multivariate, grouped for conditionals) or random."""

    name: Literal["tpe", "random"] = "tpe"
    n_startup_trials: Annotated[int, Field(ge=0)] = 5  # TPE: random trials first
    seed: int | None = 0


@params_model
class PrunerParams:
    """``hpo.pruner``: median, successive halving or none, fed each epoch's val objective."""

    name: Literal["median", "successive_halving", "none"] = "median"
    n_startup_trials: Annotated[int, Field(ge=0)] = 3  # median: never prune before these finish
    n_warmup_steps: Annotated[int, Field(ge=0)] = 1  # median: never prune before this epoch


def make_sampler(params: SamplerParams, offset: int = 0) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of ``params`` (TPE: ``group=True`` models conditional subspaces);
    its seed is ``seed + offset``: a resumed study (``offset`` = its trials) must not replay
    the random draws its first driver made."""
    import optuna

    seed = None if params.seed is None else params.seed + offset
    if params.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():  # group/multivariate are "experimental" since 2.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            n_startup_trials=params.n_startup_trials,
            seed=seed,
            multivariate=True,
            group=True,
            constant_liar=True,  # parallel trials: running ones count as bad, not as absent
        )


def make_pruner(params: PrunerParams) -> optuna.pruners.BasePruner:
    """The Optuna pruner of ``params``."""
    import optuna

    if params.name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=params.n_startup_trials, n_warmup_steps=params.n_warmup_steps
        )
    if params.name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def study_name(task: str, identity: Mapping[str, Any]) -> str:
    """``hpo-<task>-<sha12>`` of what makes two searches comparable (space, objective, data,
    the params not searched, epochs): a changed one starts a new study in the same journal."""
    return f"hpo-{task}-{params_sha256(dict(identity))[:12]}"


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the journal holds it (params decoded; curve = per-epoch objective)."""

    number: int
    state: str  # COMPLETE | PRUNED | FAIL | RUNNING | WAITING
    params: dict[str, Any]
    value: float | None
    curve: tuple[tuple[int, float], ...]
    error: str | None = None
    stale: bool = False  # a dead driver's RUNNING trial, told FAIL on resume
    retry_of: int | None = None  # the stale trial whose params it runs again

    def to_json(self) -> dict[str, Any]:
        """The trial as a JSON mapping (``trials.json``)."""
        return {
            "number": self.number,
            "state": self.state,
            "params": self.params,
            "value": self.value,
            "curve": [[epoch, value] for epoch, value in self.curve],
            "error": self.error,
            "stale": self.stale,
            "retry_of": self.retry_of,
        }


@dataclass(frozen=True)
class SearchResult:
    """A study's trials and its best COMPLETE one (None: none completed)."""

    study: str
    objective: str
    direction: Literal["maximize", "minimize"]
    trials: tuple[TrialRecord, ...]
    best: TrialRecord | None

    def finished(self) -> list[TrialRecord]:
        """The trials that count against the budget (stale FAILs do not)."""
        return [t for t in self.trials if t.state in FINISHED and not t.stale]

    def to_json(self) -> dict[str, Any]:
        """The study as a JSON mapping (``trials.json``)."""
        return {
            "study": self.study,
            "objective": self.objective,
            "direction": self.direction,
            "best": None if self.best is None else self.best.number,
            "trials": [t.to_json() for t in self.trials],
        }


FINISHED = ("COMPLETE", "PRUNED", "FAIL")


def record(trial: optuna.trial.FrozenTrial, space: Space) -> TrialRecord:
    """The :class:`TrialRecord` of a journal trial."""
    retry_of = trial.user_attrs.get("retry_of")
    return TrialRecord(
        number=trial.number,
        state=trial.state.name,
        params=search_space.decode(space, trial.params),
        value=trial.value,
        curve=tuple(sorted((int(s), float(v)) for s, v in trial.intermediate_values.items())),
        error=trial.user_attrs.get("error"),
        stale=bool(trial.user_attrs.get("stale", False)),
        retry_of=None if retry_of is None else int(retry_of),
    )


def result(study: optuna.Study, space: Space, objective: str) -> SearchResult:
    """The :class:`SearchResult` of ``study``."""
    from optuna.trial import TrialState

    trials = tuple(record(t, space) for t in study.get_trials(deepcopy=False))
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = record(study.best_trial, space) if complete else None
    direction = "maximize" if study.direction.name == "MAXIMIZE" else "minimize"
    return SearchResult(study.study_name, objective, direction, trials, best)


# --------------------------------------------------------------------------- the study


@contextlib.contextmanager
def driver_lock(path: Path) -> Iterator[None]:
    """Hold the study's exclusive driver lock (one error line when another driver has it);
    a killed driver's lock goes with its process."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StepError(f"{path}: another hpo driver is running this study") from None
    try:
        yield
    finally:
        os.close(fd)


def open_study(
    study_dir: Path,
    name: str,
    direction: Literal["maximize", "minimize"],
    sampler: SamplerParams,
    pruner: PrunerParams,
) -> optuna.Study:
    """The study ``name`` in ``study_dir``'s journal, created or loaded."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(study_dir / JOURNAL)))
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction=direction,
        sampler=make_sampler(sampler),
        pruner=make_pruner(pruner),
        load_if_exists=True,
    )
    done = len(study.get_trials(deepcopy=False))
    if done:  # resumed: fresh draws, still a function of the seed and the journal
        study.sampler = make_sampler(sampler, offset=done)
    return study


def recover_stale(study: optuna.Study) -> list[int]:
    """Tell every RUNNING trial FAIL (``stale``: its driver is dead, as the lock proves) and
    enqueue its params again; the stale trials' numbers."""
    from optuna.trial import Trial, TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        Trial(study, trial._trial_id).set_user_attr("stale", True)
        study.tell(trial.number, state=TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})
        log.warning("hpo: trial %d was running when its driver died: run again", trial.number)
    return [t.number for t in stale]


def counts(study: optuna.Study) -> tuple[int, int]:
    """(finished, failed) trials that count against the budget (stale FAILs do not)."""
    finished = failed = 0
    for trial in study.get_trials(deepcopy=False):
        if trial.state.name in FINISHED and not trial.user_attrs.get("stale"):
            finished += 1
            failed += trial.state.name == "FAIL"
    return finished, failed


# --------------------------------------------------------------------------- one trial


@dataclass
class Outcome:
    """How a trial's process ended."""

    returncode: int
    curve: list[tuple[int, float]] = field(default_factory=list)
    pruned: bool = False
    stopped: str | None = None  # why the driver stopped it (wall budget, search stopped)
    stderr: str = ""


def _signal_group(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop(proc: subprocess.Popen[str]) -> int:
    """SIGTERM the trial's process group, SIGKILL it if still there after ``TERM_GRACE_S``."""
    _signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        return proc.wait()


def run_trial(
    argv: Sequence[str],
    env: Mapping[str, str],
    on_epoch: Callable[[int, float], bool],
    objective: str,
    should_stop: Callable[[], str | None],
) -> Outcome:
    """Run one trial's process: each metric line's objective goes to ``on_epoch(epoch,
    value)``, which answers whether to prune (then the group gets SIGTERM); ``should_stop()``
    answering a reason stops it too (checked every ``WATCH_S`` seconds). The trial runs in its
    own session (a prune signals its whole group) and dies with this thread: a SIGKILLed
    search leaves no trial running (:mod:`components.core.children`)."""
    children.load()
    proc = subprocess.Popen(  # noqa: PLW1509 - preexec_fn: only prctl, loaded before the fork
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        env=dict(env),
        start_new_session=True,
        preexec_fn=children.die_with_parent,
    )
    outcome = Outcome(returncode=0)
    tail: deque[str] = deque(maxlen=STDERR_TAIL)
    done = threading.Event()
    assert proc.stdout is not None and proc.stderr is not None
    drain = threading.Thread(target=lambda: tail.extend(proc.stderr or ()), daemon=True)
    drain.start()

    def watch() -> None:
        while not done.wait(WATCH_S):
            reason = should_stop()
            if reason is not None:
                outcome.stopped = reason
                _signal_group(proc, signal.SIGTERM)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for line in proc.stdout:
            parsed = trial_metrics.parse_line(line, [objective])
            if parsed is None:
                continue
            epoch, values = parsed
            outcome.curve.append((epoch, values[objective]))
            if on_epoch(epoch, values[objective]):
                outcome.pruned = True
                break
    finally:
        outcome.returncode = _stop(proc) if outcome.pruned or outcome.stopped else proc.wait()
        done.set()
        proc.stdout.close()
        drain.join()
        proc.stderr.close()
        watcher.join()
    outcome.stderr = "".join(tail).strip()
    return outcome


# --------------------------------------------------------------------------- the driver


def _summary(error: str) -> str:
    """A trial's error in one line: its first line's cause, and stderr's last line."""
    head, _, first = error.partition(": ")
    lines = error.splitlines()
    return f"{head}: {lines[-1]}" if len(lines) > 1 else f"{head}: {first}"


@dataclass
class _Driver:
    study: optuna.Study
    space: Space
    params: Mapping[str, Any]
    objective: str
    argv: Callable[[int, dict[str, Any]], Sequence[str]]
    budget: BudgetParams
    env: dict[str, str]
    clock: Clock
    elapsed_before: float
    after_trial: Callable[[optuna.trial.FrozenTrial], None] | None
    progress: Any
    start: float = 0.0
    running: int = 0
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def elapsed(self) -> float:
        return self.elapsed_before + self.clock.monotonic() - self.start

    def past_deadline(self) -> bool:
        return self.elapsed() >= self.budget.wall_s

    def should_stop(self) -> str | None:
        """Why a running trial must stop now (None: it may go on)."""
        if self.past_deadline():
            return f"timeout: past the wall budget {self.budget.wall_s:g}s"
        if self.stopped.is_set():
            return "stopped: the search stopped"
        return None

    def claim(self) -> bool:
        """Whether this worker may start one more trial (and count it as running)."""
        with self.lock:
            self.study.set_user_attr("elapsed_s", self.elapsed())  # a resume counts it
            if self.stopped.is_set():
                return False
            if self.past_deadline():
                log.warning("hpo: wall budget %gs spent: no more trials", self.budget.wall_s)
                self.stopped.set()
                return False
            finished, _ = counts(self.study)
            if finished + self.running >= self.budget.trials:
                return False
            self.running += 1
            return True

    def work(self) -> None:
        while self.claim():
            try:
                self.one_trial()
            except BaseException as exc:  # raised again by run_search, in the caller's thread
                with self.lock:
                    self.error = self.error or exc
                self.stopped.set()
            finally:
                with self.lock:
                    self.running -= 1

    def one_trial(self) -> None:
        from optuna.trial import TrialState

        with self.lock:  # the sampler reads every trial: one ask at a time
            trial = self.study.ask()
            sample = search_space.suggest(trial, self.space, self.params)

        def on_epoch(epoch: int, value: float) -> bool:
            trial.report(value, epoch)
            return trial.should_prune()

        try:
            argv = self.argv(trial.number, sample)
            outcome = run_trial(argv, self.env, on_epoch, self.objective, self.should_stop)
        except OSError as exc:
            outcome = Outcome(returncode=-1, stderr=f"cannot start the trial: {exc}")
        except BaseException:
            with self.lock:  # never leave it RUNNING: a resume would take it for a dead one
                self.study.tell(trial, state=TrialState.FAIL)
            raise
        state, value, error = self.judge(outcome)
        summary = ""
        if error is not None:
            trial.set_user_attr("error", error)
            summary = f"trial {trial.number} {_summary(error)}"
            log.warning("hpo: %s failed", summary)
        with self.lock:
            frozen = self.study.tell(trial, values=value, state=state)
        self.progress.update(1)
        if state == TrialState.FAIL:
            self.check_fail_share(summary)
        if self.after_trial is not None:
            self.after_trial(frozen)

    def judge(self, outcome: Outcome) -> tuple[Any, float | None, str | None]:
        """(state, value, error) of a finished process."""
        from optuna.trial import TrialState

        if outcome.pruned:
            return TrialState.PRUNED, None, None
        if outcome.stopped:
            return TrialState.FAIL, None, outcome.stopped
        if outcome.returncode != 0:
            tail = outcome.stderr or "(no stderr)"
            return TrialState.FAIL, None, f"exit {outcome.returncode}: {tail}"
        if not outcome.curve:
            return TrialState.FAIL, None, f"exit 0 but printed no {self.objective} metric line"
        values = [v for _, v in outcome.curve]  # train keeps its best epoch's model
        best = max(values) if self.study.direction.name == "MAXIMIZE" else min(values)
        return TrialState.COMPLETE, best, None

    def check_fail_share(self, last: str) -> None:
        finished, failed = counts(self.study)
        share = failed / finished if finished else 0.0
        if finished >= MIN_FINISHED and share > self.budget.max_fail_fraction:
            self.stopped.set()
            raise StepError(
                f"hpo: {failed} of {finished} trials failed ({share:.0%} > "
                f"hpo.budget.max_fail_fraction {self.budget.max_fail_fraction:g}); last: {last}"
            )


def run_search(
    study_dir: Path,
    name: str,
    space: Space,
    params: Mapping[str, Any],
    objective: str,
    direction: Literal["maximize", "minimize"],
    argv: Callable[[int, dict[str, Any]], Sequence[str]],
    *,
    budget: BudgetParams,
    sampler: SamplerParams,
    pruner: PrunerParams,
    env: Mapping[str, str] | None = None,
    enqueue: Sequence[Mapping[str, Any]] = (),
    clock: Clock = SYSTEM_CLOCK,
    after_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
) -> SearchResult:
    """Search ``space`` (validated) around the merged ``params`` in study ``name`` under
    ``study_dir`` until ``budget`` is spent; a killed search run again resumes (module
    docstring). ``argv(number, sample)`` is trial ``number``'s command for ``sample`` (dotted
    key -> value); ``enqueue``: samples tried right after trial 0 (a new study only)."""
    from tqdm import tqdm

    study_dir.mkdir(parents=True, exist_ok=True)
    with driver_lock(study_dir / LOCK):
        study = open_study(study_dir, name, direction, sampler, pruner)
        recover_stale(study)
        if not study.get_trials(deepcopy=False):
            now = search_space.current(space, params)
            first = search_space.in_space(space, now)
            if outside := sorted(set(now) - set(first)):
                log.warning("hpo: trial 0 samples %s: current value outside the space", outside)
            for sample in (first, *(search_space.in_space(space, s) for s in enqueue)):
                if sample:
                    study.enqueue_trial(sample)
        finished, _ = counts(study)
        trial_env = {**os.environ, **(env or {}), TRIAL_ENV: "1"}
        with tqdm(
            total=budget.trials, initial=finished, desc="hpo", unit="trial", disable=None
        ) as bar:
            driver = _Driver(
                study=study,
                space=space,
                params=params,
                objective=objective,
                argv=argv,
                budget=budget,
                env=trial_env,
                clock=clock,
                elapsed_before=float(study.user_attrs.get("elapsed_s", 0.0)),
                after_trial=after_trial,
                progress=bar,
                start=clock.monotonic(),
            )
            workers = [
                threading.Thread(target=driver.work, name=f"hpo-{i}")
                for i in range(budget.parallel)
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        if driver.error is not None:
            raise driver.error
        return result(study, space, objective)


def score_runs(
    argvs: Sequence[Sequence[str]],
    objective: str,
    direction: Literal["maximize", "minimize"],
    *,
    parallel: int,
    env: Mapping[str, str] | None = None,
    names: Sequence[str] = (),
    record: Path | None = None,
    keys: Sequence[str] = (),
) -> list[float]:
    """Run each command to its end (no pruning), ``parallel`` at once, and return each one's
    best ``objective`` over its epochs (what train keeps); a failed run is one error line
    naming it (``names``: how to call each run). With ``record`` (a JSON-lines file) and
    ``keys`` (what each run trains, hashed), a run whose key is recorded is not run again:
    its recorded score is used (a killed or repeated adoption costs only the missing runs)."""
    from concurrent.futures import ThreadPoolExecutor

    trial_env = {**os.environ, **(env or {}), TRIAL_ENV: "1"}
    best = max if direction == "maximize" else min
    known = recorded_scores(record) if record is not None else {}
    lock = threading.Lock()

    def one(index: int) -> float:
        name = names[index] if index < len(names) else f"run {index}"
        key = keys[index] if index < len(keys) else None
        if key is not None and key in known:
            log.info("hpo: %s: %s %.6g, recorded in %s", name, objective, known[key], record)
            return known[key]
        outcome = run_trial(argvs[index], trial_env, lambda e, v: False, objective, lambda: None)
        if outcome.returncode != 0 or not outcome.curve:
            why = _summary(f"exit {outcome.returncode}: {outcome.stderr or '(no stderr)'}")
            raise StepError(f"hpo: {name} failed: {why}")
        score = best(v for _, v in outcome.curve)
        if record is not None and key is not None:
            line = json.dumps({"key": key, "score": score, "run": name}) + "\n"
            with lock, record.open("a", encoding="utf-8") as f:
                f.write(line)
        return score

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, range(len(argvs))))


def recorded_scores(record: Path) -> dict[str, float]:
    """key -> score of the runs in ``record`` (none when it is missing; a line a killed
    writer left torn is skipped)."""
    out: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError), record.open(encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                row = json.loads(line)
                out[str(row["key"])] = float(row["score"])
    return out


def save_plots(study: optuna.Study, dest: Path) -> list[Path]:
    """Optuna's parallel-coordinate and importance plots of ``study`` as PNG files (matplotlib,
    no browser); a plot the trials cannot support yet (fewer than two complete trials, no
    varying param) is skipped and logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as oplt

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varying = {
        k for t in complete for k in t.params if len({str(c.params.get(k)) for c in complete}) > 1
    }
    written: list[Path] = []
    if len(complete) < 2 or not varying:
        log.info("hpo: %d complete trial(s), no varying param: no plots", len(complete))
        return written
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", UserWarning)  # matplotlib: a constant axis's ylim
        for name, draw in (
            ("parallel_coordinate.png", lambda: oplt.plot_parallel_coordinate(study)),
            ("param_importances.png", lambda: oplt.plot_param_importances(study)),
        ):
            try:
                axes = draw()
            except (ValueError, RuntimeError) as exc:  # e.g. importances of a constant space
                log.info("hpo: no %s: %s", name, exc)
                continue
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            figure.savefig(dest / name, dpi=100, bbox_inches="tight")
            plt.close(figure)
            written.append(dest / name)
    return written
