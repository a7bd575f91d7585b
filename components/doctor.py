"""``paddle-mlops doctor``: what this machine can do for the pipeline, one line per check.

Like ``paddle.utils.run_check()`` (which it runs), but for the whole pipeline: Paddle, CUDA and
GPUs, whether AMP would be effective, OpenVINO's devices and the CPU's instruction sets, a
container builder, the MLflow tracking server, the DVC remote and the C++ server binary. Each
line says ``ok``, ``warn`` (optional: the pipeline runs, with less) or ``FAIL`` (``make run``
would fail) and what to do about it. Exit code 1 when any check fails; ``make run`` runs it
first. ``--json`` prints the same checks as a JSON list.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError
from components.core.config import load_params, section
from components.core.uris import redact_uri
from components.kernel.step import load

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
SERVER_BINARY = REPO / "build" / "serving" / "paddle-mlops-server"
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # what the steps use without MLFLOW_TRACKING_URI
TIMEOUT_S = 5.0  # every probe of another process or server is bounded by this
# CPU flags (Linux /proc/cpuinfo names) the runtimes' fast paths use
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    finding: str
    advice: str = ""

    def line(self) -> str:
        mark = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}[self.status]
        tail = f" — {self.advice}" if self.advice else ""
        return f"{mark}  {self.name}: {self.finding}{tail}"


def check_paddle() -> Check:
    try:
        import paddle
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        return Check("paddle", "fail", f"cannot import paddle ({exc})", "make install")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            paddle.utils.run_check()
    except Exception as exc:  # noqa: BLE001
        return Check(
            "paddle", "fail", f"paddle {paddle.__version__}: run_check failed ({exc})",
            "reinstall paddlepaddle from constraints.txt (make install)",
        )  # fmt: skip
    said = [ln.strip() for ln in out.getvalue().splitlines() if "works well" in ln]
    return Check(
        "paddle", "ok", f"paddle {paddle.__version__}: {said[-1] if said else 'run_check passed'}"
    )


def check_gpu_and_amp(amp: str) -> list[Check]:
    import paddle

    cuda = paddle.device.is_compiled_with_cuda()
    count = paddle.device.cuda.device_count() if cuda else 0
    if count:
        names = [paddle.device.cuda.get_device_name(i) for i in range(count)]
        gpu = Check("gpu", "ok", f"{count} CUDA device(s): {', '.join(names)}")
        capability = paddle.device.cuda.get_device_capability(0)
        fast = capability[0] >= 7  # tensor cores: where float16 AMP speeds training up
        effective = "off" if amp == "off" else ("O1" if amp == "auto" else amp)
        amp_check = Check(
            "amp",
            "ok" if fast or amp == "off" else "warn",
            f"train.amp={amp} -> {effective} on compute capability {capability[0]}.{capability[1]}",
            "" if fast else "no tensor cores: AMP saves memory but little time",
        )
        return [gpu, amp_check]
    why = "a CPU-only paddle wheel" if not cuda else "no CUDA device visible"
    return [
        Check("gpu", "warn", f"none ({why}): training runs on the CPU", "fine for the digits"),
        Check(
            "amp",
            "ok" if amp == "off" else "warn",
            f"train.amp={amp}: not effective without a GPU (the train step trains fp32 and "
            "records amp_effective=off)",
            "" if amp == "off" else "expected on CPU; set train.amp: off to silence the warning",
        ),
    ]


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def check_openvino() -> list[Check]:
    try:
        import openvino as ov
    except Exception as exc:  # noqa: BLE001
        return [Check("openvino", "fail", f"cannot import openvino ({exc})", "make install")]
    core = ov.Core()
    devices = core.available_devices
    caps = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES") if "CPU" in devices else []
    name = core.get_property("CPU", "FULL_DEVICE_NAME") if "CPU" in devices else "?"
    ov_check = Check(
        "openvino",
        "ok" if "CPU" in devices else "fail",
        f"openvino {ov.get_version().split('-')[0]}: devices {devices}; CPU {name}: "
        f"{', '.join(caps)}",
        "" if "CPU" in devices else "the exported model is served through OpenVINO's CPU plugin",
    )
    flags = cpu_flags()
    present = [f for f in ISA_FLAGS if f in flags]
    int8 = "amx_int8" in flags or "avx512_vnni" in flags or "avx_vnni" in flags
    isa = Check(
        "cpu isa",
        "ok" if int8 else "warn",
        f"{os.cpu_count()} CPUs; {', '.join(present) or 'none of ' + ', '.join(ISA_FLAGS)}",
        "" if int8 else "no VNNI/AMX: int8 (QAT) models run, but not faster than fp32",
    )
    return [ov_check, isa]


def check_builder() -> Check:
    for tool in ("podman", "docker", "buildah"):
        path = shutil.which(tool)
        if path is None:
            continue
        try:
            proc = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            continue
        if proc.returncode == 0:
            return Check("containers", "ok", proc.stdout.strip().splitlines()[0])
    return Check(
        "containers",
        "warn",
        "no podman, docker or buildah: serving_image validates the server binary but builds "
        "no image",
        "make container-deps (podman) to build and run the serving image",
    )


def check_tracking(uri: str) -> Check:
    if not uri.startswith(("http://", "https://")):
        return Check("mlflow", "ok", f"tracking URI {uri} (local: nothing to reach)")
    shown = redact_uri(uri)
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=TIMEOUT_S) as resp:
            body = resp.read(100).decode(errors="replace").strip()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Check(
            "mlflow", "fail", f"tracking server {shown} did not answer /health ({reason})",
            "start it (make mlflow-server) or unset MLFLOW_TRACKING_URI for sqlite:///mlflow.db",
        )  # fmt: skip
    return Check("mlflow", "ok", f"tracking server {shown} answers /health ({body or 'OK'})")


def venv_tool(name: str) -> str | None:
    """``name`` on PATH, else beside this interpreter (``.venv/bin/paddle-mlops doctor`` with
    the venv not activated: the venv's tools are not on PATH, but they are there)."""
    beside = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found is None and beside.is_file() and os.access(beside, os.X_OK):
        found = str(beside)
    return found


def check_dvc() -> Check:
    dvc = venv_tool("dvc")
    if dvc is None:
        beside = Path(sys.executable).parent
        return Check(
            "dvc", "fail", f"no dvc on PATH nor in {beside}", "make install (dvc is in the venv)"
        )
    try:
        proc = subprocess.run(
            [dvc, "remote", "list"], capture_output=True, text=True, timeout=30, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return Check("dvc", "warn", "dvc remote list took over 30 s")
    if proc.returncode != 0:
        return Check("dvc", "fail", f"dvc remote list failed: {proc.stderr.strip()[:200]}")
    remotes = [ln.split()[0] for ln in proc.stdout.splitlines() if ln.strip()]
    if not remotes:
        return Check(
            "dvc remote", "warn", "none configured: data/raw is regenerated from scikit-learn's "
            "digits and nothing is pushed", "dvc remote add -d NAME URL to share data and models",
        )  # fmt: skip
    return Check("dvc remote", "ok", f"configured: {', '.join(remotes)}")


def check_server(binary: Path) -> Check:
    if binary.is_file() and os.access(binary, os.X_OK):
        try:
            proc = subprocess.run(
                [str(binary), "--help"], capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except (subprocess.TimeoutExpired, OSError) as exc:
            return Check("server", "fail", f"{binary} does not run ({exc})", "make serving")
        if proc.returncode == 0:
            return Check("server", "ok", f"{binary}")
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return Check("server", "fail", f"{binary} --help exited {proc.returncode}: {tail[0]}",
                     "make serving (rebuild it)")  # fmt: skip
    if shutil.which("cmake") and shutil.which("g++"):
        return Check("server", "warn", f"{binary} not built yet: serving_image builds it",
                     "make serving builds it now")  # fmt: skip
    return Check("server", "fail", f"{binary} missing and no cmake/g++ to build it",
                 "make serving (installs the Debian packages it needs, then builds)")  # fmt: skip


def check_wrk(budget_s: float) -> Check:
    """package's serving-config search (``package.tune``) drives the server with wrk."""
    if budget_s <= 0:
        return Check("wrk", "ok", "package.tune.budget_s is 0: no serving-config search")
    found = shutil.which("wrk")
    if found:
        return Check("wrk", "ok", f"{found} (package.tune searches for {budget_s:g} s)")
    return Check("wrk", "fail", "no wrk on PATH: package's serving-config search needs it",
                 "make apt-deps (Debian package wrk), or package.tune.budget_s: 0")  # fmt: skip


def check_signing(push: bool, target: str) -> Check:
    """promote signs with PADDLE_MLOPS_SIGNING_KEY; deploy verifies against
    PADDLE_MLOPS_TRUSTED_KEYS (docs/provenance.md)."""
    from components.tracking.signing import (
        ACCEPT_ANYTHING,
        KEY_ENV,
        TRUST_ENV,
        signing_key,
        trusted_keys,
    )

    key = signing_key()
    if key is not None:
        key.load()  # an unusable key fails here, not in promote
    if target != "none":
        if os.environ.get(TRUST_ENV, "").strip() == ACCEPT_ANYTHING:
            return Check(
                "signing", "warn", f"{TRUST_ENV}={ACCEPT_ANYTHING}: deploy verifies nothing"
            )
        if not os.environ.get(TRUST_ENV, "").strip():
            # `make run` made a pair in .keys/ and names it only to the commands it runs
            made = Path(".keys/signing.pub").is_file()
            fix = (
                "make doctor (make names .keys/ itself), or export "
                f"{KEY_ENV}=$PWD/.keys/signing.key {TRUST_ENV}=$PWD/.keys/signing.pub"
                if made
                else f"paddle-mlops keys generate .keys; export {TRUST_ENV}=$PWD/.keys/signing.pub"
            )
            return Check("signing", "fail", f"deploy.target {target} and no {TRUST_ENV}: deploy "
                         "refuses every version", fix)  # fmt: skip
        trusted_keys()  # unreadable keys fail here
    if push and key is None:
        finding = f"promote.push and no {KEY_ENV}: image and version are released unsigned"
        return Check("signing", "warn", finding, f"export {KEY_ENV}=$PWD/.keys/signing.key")
    what = f"signing key {key.path}" if key else "no signing key (promote signs nothing)"
    return Check("signing", "ok", what)


def run_checks(params_file: str | Path, server_binary: Path) -> list[Check]:
    """Every check, in the order the pipeline needs them."""
    params = load_params(params_file)

    def typed(step: str) -> Any:
        """The step's own section, typed by its params model (imports the step: train's
        needs paddle, so it is read only after the paddle check passed)."""
        return section(params, step, load(step).params)

    probes: list[Callable[[], Check | list[Check]]] = [
        lambda: Check(
            "python",
            "ok" if sys.version_info[:2] == (3, 11) else "fail",
            sys.version.split()[0],
            "" if sys.version_info[:2] == (3, 11) else "the pinned wheels need Python 3.11",
        ),  # fmt: skip
        check_paddle,
        lambda: check_gpu_and_amp(typed("train").amp),
        check_openvino,
        check_builder,
        lambda: check_tracking(os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI),
        check_dvc,
        lambda: check_server(server_binary),
        lambda: check_wrk(typed("package").tune.budget_s),
        lambda: check_signing(typed("promote").push, typed("deploy").target),
    ]
    checks: list[Check] = []
    for probe in probes:
        try:
            result = probe()
        except Exception as exc:  # noqa: BLE001 - a probe that breaks is itself a finding
            result = Check(
                getattr(probe, "__name__", "check"), "fail", f"{type(exc).__name__}: {exc}"
            )
        checks += result if isinstance(result, list) else [result]
        if checks and checks[-1].name == "paddle" and checks[-1].status == "fail":
            break  # the GPU/AMP probes need paddle
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="paddle-mlops doctor", description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (train.amp)")
    parser.add_argument(
        "--server-binary",
        default=os.environ.get("PADDLE_MLOPS_SERVER_BINARY") or str(SERVER_BINARY),
        help="the C++ server (default: $PADDLE_MLOPS_SERVER_BINARY, else %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    try:
        checks = run_checks(args.params, Path(args.server_binary))
    except StepError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    if args.json:
        sys.stdout.write(json.dumps([asdict(c) for c in checks], indent=2) + "\n")
    else:
        sys.stdout.write("".join(c.line() + "\n" for c in checks))
    failed = [c.name for c in checks if c.status == "fail"]
    if failed and not args.json:
        sys.stdout.write(f"{len(failed)} check(s) failed: {', '.join(failed)}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
