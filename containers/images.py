"""Build the project's images with podman from this repository alone.

    python containers/images.py build            # base images, component image, server image
        [--no-sbom]                              # their SBOMs left to a later build
        [--policy-check]                         # and the policy-check image (below)
    python containers/images.py refs             # the refs an unchanged tree builds (JSON)
    python containers/images.py policy-check     # containers/image with sigstore (below)

1. Two base images from Debian packages (``mmdebstrap`` → ``podman import``), so no public
   image registry is needed: ``base-python`` (Python 3.11, what the steps run on) and
   ``base-runtime`` (no Python: what the C++ server runs on). In production pass any base with
   ``--build-arg BASE=python:3.11-slim-bookworm`` / ``debian:bookworm-slim`` instead.
2. The component image (``components/Containerfile``): the steps, their pinned dependencies
   and the prebuilt C++ server; multi-stage, no compiler in the runtime stage, uid 10001.
3. The server image (``serving/Containerfile``): the C++ server and the OpenVINO libraries it
   loads, taken from the component image; the serving_image step adds a model on top.

``policy-check`` is not shipped: Debian trixie's skopeo (containers/image 5.34, sigstore
enabled), to check that the ``policy.json`` deploy writes is enforced by the library podman
pulls with. Bookworm's podman and skopeo are built with sigstore disabled
(docs/provenance.md).

Tags are content hashes (the recipe, the files the build copies, the base's tag), so an
unchanged tree gives the same tags and an unchanged image is not rebuilt. ``pip install`` in a
build uses this machine's pip configuration (index mirrors, CA bundle), mounted read-only for
the build only, and its pip cache (wheels built from sdists): nothing of either is baked into
an image.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "containers" / "containers.conf"
PREFIX = os.environ.get("IMAGE_PREFIX", "paddle-mlops")
SUITE = "bookworm"
BASES = {
    # libgomp1: Paddle's CPU kernels; libgrpc++1.51, libprotobuf32: the C++ server's gRPC
    # endpoint (the server runs in both: infra validation in the component image); wrk: the
    # load of package's serving-config search
    "base-python": [
        "python3",
        "ca-certificates",
        "libgomp1",
        "libgrpc++1.51",
        "libprotobuf32",
        "wrk",
    ],
    "base-runtime": ["ca-certificates", "libgrpc++1.51", "libprotobuf32"],
}
# (suite, packages) of the policy-check image: containers/image (skopeo) and cosign
POLICY_CHECK = ("trixie", ["skopeo", "cosign", "ca-certificates"])
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# what the component image's build copies (its content tag covers exactly these)
COMPONENT_FILES = [
    "pyproject.toml",
    "constraints.txt",
    "params.yaml",
    "components",
    "pipelines",
    "serving/src",
    "serving/proto",
    "serving/CMakeLists.txt",
    "serving/tests",
    "components/Containerfile",
]
SERVER_FILES = ["serving/Containerfile"]

log = logging.getLogger("images")


def podman(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(CONF)}
    return subprocess.run(
        ["podman", *args],
        env=env,
        text=True,
        check=False,
        capture_output=capture,
    )


def exists(ref: str) -> bool:
    return podman("image", "exists", ref).returncode == 0


def tracked(paths: list[str]) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(REPO / p for p in out.split("\0") if p)


def content_tag(*parts: str, files: list[Path] = ()) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    for f in files:
        h.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def base_ref(name: str, packages: list[str], suite: str = SUITE) -> str:
    """The ref of an image made from Debian ``suite``'s ``packages`` alone."""
    return f"{PREFIX}/{name}:{content_tag(suite, 'minbase', *packages)}"


def refs() -> dict[str, str]:
    bases = {name: base_ref(name, pkgs) for name, pkgs in BASES.items()}
    components = f"{PREFIX}/components:" + content_tag(
        bases["base-python"], files=tracked(COMPONENT_FILES)
    )
    server = f"{PREFIX}/server:" + content_tag(
        bases["base-runtime"], components, files=tracked(SERVER_FILES)
    )
    return {**bases, "components": components, "server": server}


def pip_mounts() -> list[str]:
    """Read-only ``-v`` mounts of this machine's pip configuration and the local paths it
    names (mirrors, wheel dirs, constraints), plus its CA bundle at /run/host-ca.crt."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "debug"], capture_output=True, text=True
    )
    paths: set[str] = set()
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.endswith(", exists: True"):
            paths.add(line.split(",")[0])
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    for line in listing.splitlines():
        value = line.split("=", 1)[1].strip("'\"") if "=" in line else ""
        for token in value.split():
            token = token.removeprefix("file://").rstrip("/")
            if token.endswith("/simple"):  # a file:// index links to files beside it
                token = token.removesuffix("/simple")
            if token.startswith("/") and Path(token).exists():
                paths.add(token)
    ca = "/etc/ssl/certs/ca-certificates.crt"
    mounts = [f"{p}:{p}:ro" for p in sorted(paths) if p != ca]
    if Path(ca).exists():
        mounts.append(f"{ca}:/run/host-ca.crt:ro")
    # the host's pip cache (the wheels it built from sdists, what it downloaded): the build
    # reuses and adds to it, like a BuildKit cache mount; never part of the image
    cache = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True
    ).stdout.strip()
    if cache and Path(cache).is_dir():
        mounts.append(f"{cache}:/run/pip-cache")
    return [arg for m in mounts for arg in ("-v", m)]


def build_base(ref: str, packages: list[str], suite: str = SUITE) -> None:
    """``suite`` other than the host's: from ``DEBIAN_MIRROR`` (the host's apt sources name
    only its own suites)."""
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                suite,
                str(rootfs),
                *([] if suite == SUITE else [DEBIAN_MIRROR]),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if podman("import", "--change", "CMD=/bin/bash", str(rootfs), ref).returncode:
            raise SystemExit(f"podman import {ref} failed")


def build(ref: str, containerfile: str, args: dict[str, str], extra: list[str] = ()) -> None:
    cmd = ["build", "--network", "host", "-f", containerfile, "-t", ref, *extra]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    if podman(*cmd, str(REPO)).returncode:
        raise SystemExit(f"podman build {ref} failed")


def git_sha(paths: list[str]) -> str:
    """The commit the image is built from, ``-dirty`` when ``paths`` differ from it."""
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    if not sha:
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{sha}-dirty" if dirty else sha


# the images shipped (their CycloneDX SBOMs under build/sbom/) and their Python, if any
SBOM_PYTHON = {"components": "/opt/venv/bin/python", "server": ""}


def write_sbom(ref: str, out: Path, python: str) -> None:
    """Debian packages and Python environment of ``ref`` (components/commands/sbom.py)."""
    cmd = [sys.executable, "-m", "components.commands.sbom", ref, "--out", str(out)]
    env = {**os.environ, "CONTAINERS_CONF": str(CONF), "PYTHONPATH": str(REPO)}
    subprocess.run([*cmd, *(["--python", python] if python else [])], check=True, env=env, cwd=REPO)


@contextmanager
def one_build_at_a_time() -> Iterator[None]:
    """Hold this checkout's build lock: a second build (the suite's images fixture while
    ``make test``'s early build runs) waits for the first, then finds its images up to date."""
    lock = REPO / "build" / "images.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another build of this checkout's images runs: waiting for it (%s)", lock)
            fcntl.flock(held, fcntl.LOCK_EX)
        yield


def build_all(*, sboms: bool = True) -> dict[str, dict[str, object]]:
    """Build what is missing (and, with ``sboms``, write the SBOMs that are missing)."""
    with one_build_at_a_time():
        return _build_all(sboms=sboms)


def _build_all(*, sboms: bool) -> dict[str, dict[str, object]]:
    wanted = refs()
    report: dict[str, dict[str, object]] = {}
    for name, ref in wanted.items():
        t0 = time.monotonic()
        built = not exists(ref)
        if built:
            log.info("building %s", ref)
            files = COMPONENT_FILES if name == "components" else SERVER_FILES
            common = {"GIT_SHA": git_sha(files)}
            if name in BASES:
                build_base(ref, BASES[name])
            elif name == "components":
                build(
                    ref,
                    "components/Containerfile",
                    {**common, "BASE": wanted["base-python"]},
                    pip_mounts(),
                )
            else:
                build(
                    ref,
                    "serving/Containerfile",
                    {**common, "BASE": wanted["base-runtime"], "COMPONENTS": wanted["components"]},
                )
        else:
            log.info("up to date: %s", ref)
        sbom = REPO / "build" / "sbom" / f"{name}.cdx.json"
        if sboms and name in SBOM_PYTHON and (built or not sbom.is_file()):
            write_sbom(ref, sbom, SBOM_PYTHON[name])
        size = podman("image", "inspect", "--format", "{{.Size}}", ref, capture=True)
        report[name] = {
            "ref": ref,
            "built": built,
            "seconds": round(time.monotonic() - t0, 1),
            "size_mb": round(int(size.stdout.strip() or 0) / 1e6, 1),
        }
    out = REPO / "build" / "images.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def policy_check() -> str:
    """The policy-check image's ref, built if missing."""
    suite, packages = POLICY_CHECK
    ref = base_ref("policy-check", packages, suite)
    with one_build_at_a_time():
        if not exists(ref):
            log.info("building %s", ref)
            build_base(ref, packages, suite)
    return ref


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["build", "refs", "policy-check"])
    parser.add_argument(
        "--no-sbom",
        action="store_true",
        help="build: leave the SBOMs to a later build (they need the whole install)",
    )
    parser.add_argument(
        "--policy-check",
        action="store_true",
        help="build: the (unshipped) policy-check image too, after the others",
    )
    args = parser.parse_args(argv)
    if args.command == "policy-check":
        sys.stdout.write(policy_check() + "\n")
        return 0
    if args.command == "refs":
        sys.stdout.write(json.dumps(refs(), indent=2) + "\n")
        return 0
    for name, row in build_all(sboms=not args.no_sbom).items():
        log.info(
            "%-13s %s  %s MB  %s s%s",
            name,
            row["ref"],
            row["size_mb"],
            row["seconds"],
            "" if row["built"] else " (unchanged)",
        )
    if args.policy_check:
        log.info("policy-check  %s", policy_check())
    return 0


if __name__ == "__main__":
    sys.exit(main())
