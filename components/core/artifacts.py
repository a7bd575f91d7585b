"""Atomic outputs, content hashes and step manifests shared by every step.

Every step writes its files through these helpers so that a killed step leaves either the
previous complete output or nothing, never a half-written file that looks complete.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.faults import failpoints

_CHUNK = 1 << 20


class StepError(RuntimeError):
    """A readable failure of a pipeline step (bad input, failed check).

    CLIs print the message and exit non-zero instead of showing a traceback.
    """


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_tree(path: str | os.PathLike[str]) -> dict[str, str]:
    """sha256 of every file below ``path`` (or of ``path`` itself), keyed by relative path."""
    root = Path(path)
    if root.is_file():
        return {root.name: sha256_file(root)}
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def combined_sha256(hashes: Mapping[str, str]) -> str:
    """One hash over a mapping of name -> hash (order independent)."""
    joined = "\n".join(f"{k}  {v}" for k, v in sorted(hashes.items()))
    return sha256_bytes(joined.encode())


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; rename it onto ``dest`` on success.

    Works for files and directories. On an exception the temporary is removed and ``dest``
    is left untouched.
    """
    dest = Path(dest)
    created = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    # the writer's pid in the name: sweep_dead_temporaries removes what a killed one left
    tmp = Path(
        tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp", dir=dest.parent)
    )
    target = tmp / dest.name
    try:
        try:
            yield target
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            for parent in created:  # a failed write leaves no directory it made behind
                with contextlib.suppress(OSError):
                    parent.rmdir()
            raise
        if not target.exists():
            raise FileNotFoundError(f"atomic write of {dest} produced nothing")
        failpoints.hit("artifacts.write", str(dest))
        if dest.is_dir() and not dest.is_symlink():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
            os.replace(target, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(target, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_TEMPORARY = re.compile(r"^\..+\.(\d+)\.[^.]+\.tmp$|^\..+\.old-(\d+)$")


def sweep_dead_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove from ``directory`` what :func:`atomic_path` writers that were killed (SIGKILL,
    a lost node) left: their temporaries and set-aside old outputs, recognised by the dead
    writer's pid in the name. A live writer's are left alone. Returns what was removed."""
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        match = _TEMPORARY.match(entry.name)
        if not match:
            continue
        pid = int(match.group(1) or match.group(2))
        try:
            os.kill(pid, 0)
            continue  # alive (or a reused pid): not ours to judge
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def write_text(dest: str | os.PathLike[str], text: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)


def write_json(dest: str | os.PathLike[str], obj: Any) -> Path:
    return write_text(dest, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise StepError(f"{path}: file not found (did the previous step run?)") from exc
    except json.JSONDecodeError as exc:
        raise StepError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return obj.as_posix()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def git_sha(cwd: str | os.PathLike[str] | None = None) -> str:
    """The commit of the code that runs (``GIT_SHA`` in an image; else the git checkout this
    package is in, whatever the working directory), ``-dirty`` when that tree has changes,
    or ``unknown``."""
    env_sha = os.environ.get("GIT_SHA")
    if env_sha:
        return env_sha
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # files the pipeline itself rewrites do not make the code "dirty"
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)dvc.lock",
                ":(exclude)metrics",
                ":(exclude)plots",
            ],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def versions() -> dict[str, str]:
    """Versions of the runtime pieces that change results (installed distributions)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name, dist in (("paddle", "paddlepaddle"), ("openvino", "openvino"), ("numpy", "numpy")):
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            module = sys.modules.get(name)
            if module is not None:  # e.g. paddlepaddle-gpu installs the same module
                out[name] = getattr(module, "__version__", "unknown")
    return out


# CPU features that change which kernels Paddle and OpenVINO pick (int8: VNNI/AMX; bf16)
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def machine(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> dict[str, Any]:
    """The hardware a step ran on: two runs on different CPUs must be told apart."""
    model, flags = platform.processor() or "unknown", set()
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model in ("unknown", platform.machine()):
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "cpu_model": model,
        "isa": [f for f in ISA_FLAGS if f in flags],
        "cores": os.cpu_count() or 0,
        "usable_cores": usable,
        "arch": platform.machine(),
        "os": platform.platform(),
    }


def machine_tags(info: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``machine()`` flattened into MLflow tag strings."""
    info = machine() if info is None else info
    return {
        "machine.cpu": str(info.get("cpu_model", "unknown")),
        "machine.isa": ",".join(info.get("isa", [])) or "none",
        "machine.cores": str(info.get("usable_cores", info.get("cores", 0))),
        "machine.arch": str(info.get("arch", "")),
    }


# when the step running in this context started (epoch seconds): Step.call sets it, so every
# manifest a step writes says when the step's work began (``started_at``), not only when it
# ended; MLflow's step runs carry these times (the track step)
_STEP_STARTED: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "step_started", default=None
)


@contextlib.contextmanager
def step_clock(now: float | None = None) -> Iterator[float]:
    """The step's work starts now (or at ``now``, epoch seconds) for the manifests written
    inside the block (:func:`write_manifest`'s ``started_at``)."""
    started = time.time() if now is None else now
    token = _STEP_STARTED.set(started)
    try:
        yield started
    finally:
        _STEP_STARTED.reset(token)


def iso_ms(epoch_s: float) -> str:
    """``epoch_s`` as an ISO 8601 UTC timestamp with milliseconds."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")


def write_manifest(
    out_dir: str | os.PathLike[str],
    step: str,
    *,
    inputs: Mapping[str, str | os.PathLike[str]],
    outputs: Mapping[str, str | os.PathLike[str]],
    params: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``manifest.json``: what a step consumed, produced, with which params and code,
    and when: ``started_at`` (when run through :class:`components.kernel.step.Step`, which
    starts the :func:`step_clock`) and ``finished_at`` (now), ISO 8601 UTC with milliseconds."""
    finished = time.time()
    started = _STEP_STARTED.get()
    manifest = {
        "step": step,
        "created_at": datetime.fromtimestamp(finished, UTC).isoformat(timespec="seconds"),
        **({"started_at": iso_ms(started)} if started is not None else {}),
        "finished_at": iso_ms(finished),
        "inputs": {k: _hash_entry(v) for k, v in inputs.items()},
        "outputs": {k: _hash_entry(v, relative_to=out_dir) for k, v in outputs.items()},
        "params": dict(params),
        "git_sha": git_sha(),
        "versions": versions(),
        "machine": machine(),
    }
    if extra:
        manifest.update(extra)
    return write_json(Path(out_dir) / "manifest.json", manifest)


def _hash_entry(
    path: str | os.PathLike[str], relative_to: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Hash a file or directory; outputs are named relative to the step's output dir
    (they are usually hashed inside a temporary directory before the atomic rename)."""
    p = Path(path)
    shown = p.as_posix()
    if relative_to is not None:
        try:
            shown = p.relative_to(relative_to).as_posix()
        except ValueError:
            pass
    if p.is_dir():
        files = sha256_tree(p)
        return {"path": shown, "sha256": combined_sha256(files), "files": files}
    if p.is_file():
        return {"path": shown, "sha256": sha256_file(p)}
    return {"path": shown, "sha256": None}
