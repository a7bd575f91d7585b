"""Container images of the serving step: find a builder, build, push (library layer).

``serving_image`` builds the image it validated (no push: nothing leaves this machine before
the model is blessed); ``promote`` pushes it once the model is blessed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from components.core.artifacts import StepError

BUILDERS = ("docker", "podman", "buildah")
CONTAINERS_CONF = Path(__file__).resolve().parents[2] / "containers" / "containers.conf"


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """A builder command; podman reads the project's containers.conf unless the caller set
    ``CONTAINERS_CONF`` (without it podman cannot run containers on these hosts)."""
    env = dict(os.environ)
    if CONTAINERS_CONF.is_file():
        env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **kwargs)  # type: ignore[call-overload]


def image_repository(ref: str) -> str:
    """``host:5000/a/b:tag`` or ``a/b@sha256:..`` -> ``host:5000/a/b``."""
    ref = ref.split("@", 1)[0]
    slash, colon = ref.rfind("/"), ref.rfind(":")
    return ref[:colon] if colon > slash else ref


def image_present(builder: str, ref: str | None) -> bool:
    """Whether ``ref`` is in ``builder``'s local store (no registry is asked)."""
    if not ref:
        return False
    cmd = (
        [builder, "inspect", "--type", "image", ref]
        if builder == "buildah"
        else [builder, "image", "inspect", ref]
    )
    return _run(cmd).returncode == 0


def detect_builder(requested: str) -> tuple[str | None, str]:
    """The first working image builder, or None with the reason."""
    if requested not in (*BUILDERS, "auto", "none"):
        raise StepError(
            f"serving_image.builder: {requested!r} is not one of "
            f"{['auto', *BUILDERS, 'none']} (in a cluster, kaniko builds the image)"
        )
    if requested == "none":
        return None, "builder: none in params"
    candidates = list(BUILDERS) if requested == "auto" else [requested]
    reasons = []
    for tool in candidates:
        if shutil.which(tool) is None:
            reasons.append(f"{tool}: not installed")
            continue
        probe = [tool, "info"] if tool != "buildah" else [tool, "version"]
        proc = _run(probe, timeout=60)
        if proc.returncode == 0:
            return tool, "ok"
        first = (proc.stderr or proc.stdout).strip().splitlines()
        reasons.append(f"{tool}: {first[-1] if first else 'unusable'}")
    return None, "; ".join(reasons)


def build_image(builder: str, context: Path, ref: str) -> str:
    """Build ``ref`` from ``context`` (its ``Dockerfile``); returns the image id."""
    cmd = [builder, "bud"] if builder == "buildah" else [builder, "build"]
    cmd += ["-t", ref, "-f", str(context / "Dockerfile"), str(context)]
    proc = _run(cmd)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise StepError(f"{builder} build of {ref} failed:\n{tail}")
    fmt = "{{.Id}}" if builder != "buildah" else "{{.FromImageDigest}}"
    return _run([builder, "inspect", "--format", fmt, ref]).stdout.strip()


def push_image(builder: str, ref: str) -> str:
    """Push ``ref``; returns the digest (``sha256:...``) of the manifest the registry stored."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        digest_file = Path(tmp) / "digest"
        extra = ["--digestfile", str(digest_file)] if builder in ("podman", "buildah") else []
        proc = _run([builder, "push", *extra, ref])
        if proc.returncode != 0:
            raise StepError(f"{builder} push {ref} failed: {proc.stderr.strip()[-500:]}")
        if digest_file.is_file():
            return digest_file.read_text().strip()
    # docker: the repo digest recorded for this repository by the push
    repository = ref.rsplit(":", 1)[0] if ref.rfind(":") > ref.rfind("/") else ref
    fmt = "{{range .RepoDigests}}{{println .}}{{end}}"
    for line in _run([builder, "inspect", "--format", fmt, ref]).stdout.split():
        if line.startswith(repository + "@"):
            return line.split("@", 1)[1]
    raise StepError(f"{builder} push {ref}: the registry returned no digest")
