"""Bad input through the real step CLIs: one readable ``error:`` line, exit code 1, no traceback.

Every case runs ``python -m components.<step>`` as a subprocess in a temporary directory with
a params file that is deliberately *not* called ``params.yaml``, so a message that hard-codes
``params.yaml`` instead of naming the file given with ``--params`` fails the case.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

from components.steps.ingest import write_idx

REPO = Path(__file__).resolve().parents[1]
PARAMS = "custom.yaml"  # any name but params.yaml
IMAGES, LABELS = "imgs-idx3-ubyte", "lbls-idx1-ubyte"
N, N_CLASSES = 40, 4


@dataclass
class Run:
    """One CLI invocation and what its single error line must contain."""

    module: str
    args: list[str]
    expect: list[str]  # substrings of the error line (file/param, field, rule)
    out: Path | None = None  # output directory that must not be left behind looking complete
    env: dict[str, str] = field(default_factory=dict)
    drop_env: tuple[str, ...] = ()  # prefixes of variables removed from the environment


# --------------------------------------------------------------------------- inputs


def _idx_dir(root: Path, labels: np.ndarray | None = None) -> Path:
    """Tiny IDX files: 40 random 6x6 images in 4 classes."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    write_idx(root / IMAGES, rng.integers(0, 256, size=(N, 6, 6), dtype=np.uint8))
    default = (np.arange(N) % N_CLASSES).astype(np.uint8)
    write_idx(root / LABELS, default if labels is None else labels)
    return root


def _folder(root: Path) -> Path:
    """Two class folders with three distinct 5x5 PNGs each."""
    for c, cls in enumerate(("a", "b")):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((5, 5), 40 * c + i, np.uint8)).save(root / cls / f"{i}.png")
    return root


def _params(tmp: Path, **sections: dict) -> Path:
    path = tmp / PARAMS
    sections = {"task": {"name": "digits"}, **sections}
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


def _idx_params(tmp: Path, source: str, **extra: object) -> Path:
    ingest = {"source": source, "kind": "mnist_idx", "idx_files": [[IMAGES, LABELS]], **extra}
    return _params(tmp, ingest=ingest)


def _ingest(tmp: Path, expect: list[str], params: Path | None = None, **kw: object) -> Run:
    out = tmp / "outputs" / "ingest"
    args = ["--params", str(params or PARAMS), "--data", str(out)]
    return Run("components.steps.ingest", args, expect, out=out, **kw)  # type: ignore[arg-type]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- cases


def sha256_is_a_number(tmp: Path) -> Run:
    _idx_params(tmp, str(_idx_dir(tmp / "raw")), sha256={IMAGES: 12345})
    return _ingest(tmp, [f"{PARAMS}: ingest.sha256.{IMAGES}: expected a string, got 12345"])


def sha256_is_null(tmp: Path) -> Run:
    _idx_params(tmp, str(_idx_dir(tmp / "raw")), sha256={LABELS: None})
    return _ingest(tmp, [f"{PARAMS}: ingest.sha256.{LABELS}: expected a string, got None"])


def sha256_is_not_hex(tmp: Path) -> Run:
    _idx_params(tmp, str(_idx_dir(tmp / "raw")), sha256={IMAGES: "abc"})
    expect = f"{PARAMS}: ingest.sha256.{IMAGES}: must match ^[0-9a-fA-F]{{64}}$, got 'abc'"
    return _ingest(tmp, [expect])


def sha256_names_no_input(tmp: Path) -> Run:
    _idx_params(tmp, str(_idx_dir(tmp / "raw")), sha256={"other-file": "0" * 64})
    return _ingest(tmp, [f"{PARAMS}: ingest.sha256 names 'other-file', not an input of"])


def image_size_zero(tmp: Path) -> Run:
    ingest = {"source": str(_folder(tmp / "img")), "kind": "image_folder", "image_size": [0, 0]}
    _params(tmp, ingest=ingest)
    return _ingest(tmp, [f"{PARAMS}: ingest.image_size[0]: must be >= 1, got 0"])


def image_size_negative(tmp: Path) -> Run:
    ingest = {"source": str(_folder(tmp / "img")), "kind": "image_folder", "image_size": [-4, 8]}
    _params(tmp, ingest=ingest)
    return _ingest(tmp, [f"{PARAMS}: ingest.image_size[0]: must be >= 1, got -4"])


def folder_subdirectory_named_png(tmp: Path) -> Run:
    root = _folder(tmp / "img")
    (root / "a" / "x.png").mkdir()
    _params(tmp, ingest={"source": str(root), "kind": "image_folder"})
    return _ingest(tmp, [f"{root / 'a' / 'x.png'}: is a directory, but its name ends in .png"])


def folder_dangling_symlink(tmp: Path) -> Run:
    root = _folder(tmp / "img")
    (root / "b" / "x.png").symlink_to(tmp / "gone.png")
    _params(tmp, ingest={"source": str(root), "kind": "image_folder"})
    return _ingest(
        tmp, [f"{root / 'b' / 'x.png'}: broken symbolic link (its target {tmp / 'gone.png'}"]
    )


def folder_unreadable_images(tmp: Path) -> Run:
    root = _folder(tmp / "img")
    (root / "a" / "1.png").write_bytes(b"")
    cut = (root / "b" / "2.png").read_bytes()
    (root / "b" / "2.png").write_bytes(cut[: len(cut) // 2])
    _params(tmp, ingest={"source": str(root), "kind": "image_folder"})
    return _ingest(
        tmp,
        [
            "2 file(s) named like images are not readable images",
            f"{root / 'a' / '1.png'}: empty file (0 bytes)",
            f"{root / 'b' / '2.png'}: ",
        ],
    )


def folder_extension_not_an_extension(tmp: Path) -> Run:
    ingest = {"source": str(_folder(tmp / "img")), "kind": "image_folder", "extensions": ["a/b"]}
    _params(tmp, ingest=ingest)
    return _ingest(tmp, [f"{PARAMS}: ingest.extensions", "'a/b' is not a file extension"])


def folder_label_names_mismatch(tmp: Path) -> Run:
    root = _folder(tmp / "img")
    _params(tmp, ingest={"source": str(root), "kind": "image_folder", "label_names": ["x"]})
    return _ingest(tmp, [f"{PARAMS}: ingest.label_names has 1 names, {root} has 2 class folders"])


def s3_without_credentials(tmp: Path) -> Run:
    pytest.importorskip("s3fs")
    _idx_params(tmp, "s3://raw-data/mnist")
    aws = tmp / "aws"  # neither file exists: no profile, no shared credentials
    env = {
        "AWS_CONFIG_FILE": str(aws / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(aws / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask the instance metadata service
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{_closed_port()}",
    }
    expect = [f"s3://raw-data/mnist/{IMAGES}: no usable AWS credentials", "AWS_ACCESS_KEY_ID"]
    return _ingest(tmp, expect, env=env, drop_env=("AWS_",))


def http_connection_refused(tmp: Path) -> Run:
    port = _closed_port()
    _idx_params(tmp, f"http://127.0.0.1:{port}/data/")
    return _ingest(
        tmp, [f"http://127.0.0.1:{port}/data/{IMAGES}: connection refused by 127.0.0.1:{port}"]
    )


def http_host_unresolvable(tmp: Path) -> Run:
    _idx_params(tmp, "http://raw-data.invalid/mnist")
    return _ingest(
        tmp,
        [f"http://raw-data.invalid/mnist/{IMAGES}: host 'raw-data.invalid' could not be resolved"],
    )


def idx_wrong_magic(tmp: Path) -> Run:
    raw = _idx_dir(tmp / "raw")
    blob = bytearray((raw / IMAGES).read_bytes())
    blob[3] = 0xFF  # the dimension count of the magic number 0x00000803
    (raw / IMAGES).write_bytes(bytes(blob))
    _idx_params(tmp, str(raw))
    return _ingest(
        tmp,
        [
            f"{raw / IMAGES}: wrong IDX magic number 0x000008ff: it declares 255 dimension(s), "
            "expected 0x00000803 (uint8 images [N, H, W], 3 dimension(s))"
        ],
    )


def idx_labels_file_as_images(tmp: Path) -> Run:
    raw = _idx_dir(tmp / "raw")
    _params(tmp, ingest={"source": str(raw), "kind": "mnist_idx", "idx_files": [[LABELS, LABELS]]})
    return _ingest(
        tmp, [f"{raw / LABELS}: wrong IDX magic number 0x00000801", "expected 0x00000803"]
    )


def label_outside_data_set_labels(tmp: Path) -> Run:
    labels = (np.arange(N) % N_CLASSES).astype(np.uint8)
    labels[5] = 11  # labels 0..3 and 11: no sample has label 4..10
    _idx_params(tmp, str(_idx_dir(tmp / "raw", labels)))
    return _ingest(
        tmp,
        [
            f"{tmp / 'raw' / LABELS}: label 11 is not one of the data set's labels 0..3",
            "no sample has label 4",
            "first at index 5",
            f"{PARAMS}: ingest.label_names",
        ],
    )


def label_outside_declared_labels(tmp: Path) -> Run:
    labels = (np.arange(N) % N_CLASSES).astype(np.uint8)
    labels[7] = 11
    names = ["zero", "one", "two", "three"]
    _idx_params(tmp, str(_idx_dir(tmp / "raw", labels)), label_names=names)
    return _ingest(
        tmp,
        [
            f"{tmp / 'raw' / LABELS}: label 11 is not one of the declared labels 0..3 "
            f"({PARAMS}: ingest.label_names has 4 names)"
        ],
    )


def builtin_source_unknown(tmp: Path) -> Run:
    _params(tmp, ingest={"source": "builtin:nope", "kind": "builtin"})
    return _ingest(tmp, [f"{PARAMS}: ingest.source 'builtin:nope': only builtin:digits exists"])


def params_is_a_directory(tmp: Path) -> Run:
    (tmp / "conf").mkdir()
    return _ingest(
        tmp, [f"{tmp / 'conf'}: is a directory, --params must name a YAML file"], tmp / "conf"
    )


def out_is_an_existing_file(tmp: Path) -> Run:
    _idx_params(tmp, str(_idx_dir(tmp / "raw")))
    out = tmp / "result.npz"
    out.write_text("keep me")
    args = ["--params", PARAMS, "--data", str(out)]
    return Run(
        "components.steps.ingest", args, [f"--data {out}: is an existing file, not a directory"]
    )


def out_parent_is_a_file(tmp: Path) -> Run:
    _idx_params(tmp, str(_idx_dir(tmp / "raw")))
    (tmp / "outputs").write_text("a file")
    out = tmp / "outputs" / "ingest"
    args = ["--params", PARAMS, "--data", str(out)]
    return Run(
        "components.steps.ingest", args, [f"--data {out}: its parent {tmp / 'outputs'} is a file"]
    )


def validate_params_is_a_directory(tmp: Path) -> Run:
    (tmp / "conf").mkdir()
    out = tmp / "outputs" / "validate"
    args = ["--params", str(tmp / "conf"), "--data", str(tmp), "--report", str(out)]
    return Run("components.steps.validate", args, [f"{tmp / 'conf'}: is a directory"], out=out)


def validate_out_is_an_existing_file(tmp: Path) -> Run:
    _params(tmp, validate={"min_rows": 1})
    out = tmp / "summary.json"
    out.write_text("{}")
    args = ["--params", PARAMS, "--data", str(tmp), "--report", str(out)]
    return Run("components.steps.validate", args, [f"--report {out}: is an existing file"])


def validate_data_is_a_file(tmp: Path) -> Run:
    _params(tmp, validate={"min_rows": 1})
    (tmp / "data.npz").write_bytes(b"not a directory")
    out = tmp / "outputs" / "validate"
    args = ["--params", PARAMS, "--data", str(tmp / "data.npz"), "--report", str(out)]
    expect = [f"{tmp / 'data.npz'}: is a file, not an ingested data set directory"]
    return Run("components.steps.validate", args, expect, out=out)


def validate_bad_duplicate_bound(tmp: Path) -> Run:
    _params(tmp, validate={"max_duplicate_fraction": -0.1})
    out = tmp / "outputs" / "validate"
    args = ["--params", PARAMS, "--data", str(tmp), "--report", str(out)]
    expect = [f"{PARAMS}: validate.max_duplicate_fraction: must be >= 0, got -0.1"]
    return Run("components.steps.validate", args, expect, out=out)


def validate_workers_zero(tmp: Path) -> Run:
    _params(tmp, validate={"workers": 0})
    out = tmp / "outputs" / "validate"
    args = ["--params", PARAMS, "--data", str(tmp), "--report", str(out)]
    return Run(
        "components.steps.validate", args, [f"{PARAMS}: validate.workers: must be >= 1, got 0"]
    )


def validate_not_a_snapshot(tmp: Path) -> Run:
    _params(tmp, validate={"min_rows": 1})
    (tmp / "data").mkdir()
    out = tmp / "outputs" / "validate"
    args = ["--params", PARAMS, "--data", str(tmp / "data"), "--report", str(out)]
    expect = [f"{tmp / 'data' / 'snapshot.json'}: no snapshot manifest (run ingest"]
    return Run("components.steps.validate", args, expect, out=out)


def _ingested_shard(tmp: Path) -> tuple[Path, Any]:
    """A real snapshot of the tiny IDX files (ingested in this process) and its first shard."""
    from components.ml.data import snapshot
    from components.steps.ingest import IngestParams
    from components.steps.ingest import run as ingest_run
    from components.tasks import get_task

    raw = str(_idx_dir(tmp / "raw"))
    params = IngestParams(source=raw, kind="mnist_idx", idx_files=[[IMAGES, LABELS]])
    ingest_run(params, get_task("digits"), tmp / "data")
    _params(tmp, validate={"min_rows": 1})
    return tmp / "data", snapshot.load(tmp / "data").shards[0]


def _validate(tmp: Path, expect: list[str]) -> Run:
    out = tmp / "outputs" / "validate"
    args = ["--params", PARAMS, "--data", str(tmp / "data"), "--report", str(out)]
    return Run("components.steps.validate", args, expect, out=out)


def validate_corrupt_shard(tmp: Path) -> Run:
    data, shard = _ingested_shard(tmp)
    path = data / shard.path
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # same size: only its sha256 tells
    path.write_bytes(bytes(blob))
    pinned = f"snapshot.json pins {shard.sha256}: it is corrupt"
    return _validate(tmp, [f"{path}: shard sha256 is ", pinned])


def validate_missing_shard(tmp: Path) -> Run:
    data, shard = _ingested_shard(tmp)
    (data / shard.path).unlink()
    pinned = f"{data / shard.path}: shard missing (snapshot.json pins sha256 {shard.sha256})"
    return _validate(tmp, [pinned])


def _train(tmp: Path, options: dict, expect: list[str]) -> Run:
    _params(tmp, task={"name": "digits", "options": options}, train={"epochs": 1})
    out = tmp / "outputs" / "train"
    args = ["--params", PARAMS, "--data", str(tmp / "nodata"), "--model", str(out)]
    args += ["--checkpoints", str(tmp / "ckpt"), "--metrics", str(tmp / "m.json")]
    args += ["--plots", str(tmp / "p.csv")]
    return Run("components.steps.train", args, expect, out=out)


def task_image_size_zero(tmp: Path) -> Run:
    return _train(
        tmp,
        {"image_size": [0, 0]},
        [f"{PARAMS}: task.options.image_size[0]: must be >= 12, got 0"],
    )


def task_mean_std_mismatch(tmp: Path) -> Run:
    return _train(
        tmp,
        {"mean": [0.5, 0.5], "std": [0.5]},
        [f"{PARAMS}: task.options: mean [0.5, 0.5] and std [0.5] must be non-empty and of the"],
    )


def task_unknown(tmp: Path) -> Run:
    _params(tmp, task={"name": "ernie"}, train={"epochs": 1})
    args = ["--params", PARAMS, "--data", str(tmp / "nodata")]
    args += ["--model", str(tmp / "outputs" / "train")]
    return Run("components.steps.train", args, [f"{PARAMS}: task.name 'ernie' is not a known task"])


def _out_is_a_file(step: str) -> Callable[[Path], Run]:
    from components.kernel.step import flag, load

    out = f"--{flag(load(step).cli_outputs()[0].name)}"  # the step's main output

    def case(tmp: Path) -> Run:
        (tmp / "result").write_text("not a directory\n")
        args = ["--params", PARAMS, out, str(tmp / "result")]
        return Run(
            f"components.steps.{step}",
            args,
            [f"{out} {tmp / 'result'}: is an existing file, not a"],
        )

    case.__name__ = f"{step}_out_is_an_existing_file"
    return case


OTHER_STEPS_OUT_IS_A_FILE = [
    _out_is_a_file(step)
    for step in ("train", "export", "qat", "package", "evaluate", "serving_image", "track")
    + ("register", "promote")
]


CASES: list[Callable[[Path], Run]] = [
    sha256_is_a_number,
    sha256_is_null,
    sha256_is_not_hex,
    sha256_names_no_input,
    image_size_zero,
    image_size_negative,
    folder_subdirectory_named_png,
    folder_dangling_symlink,
    folder_label_names_mismatch,
    folder_unreadable_images,
    folder_extension_not_an_extension,
    s3_without_credentials,
    http_connection_refused,
    http_host_unresolvable,
    idx_wrong_magic,
    idx_labels_file_as_images,
    label_outside_data_set_labels,
    label_outside_declared_labels,
    builtin_source_unknown,
    params_is_a_directory,
    out_is_an_existing_file,
    out_parent_is_a_file,
    validate_params_is_a_directory,
    validate_out_is_an_existing_file,
    validate_data_is_a_file,
    validate_bad_duplicate_bound,
    validate_workers_zero,
    validate_not_a_snapshot,
    validate_corrupt_shard,
    validate_missing_shard,
    task_image_size_zero,
    task_mean_std_mismatch,
    task_unknown,
    *OTHER_STEPS_OUT_IS_A_FILE,
]


def _run(case: Run, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not any(k.startswith(prefix) for prefix in case.drop_env)
    }
    env.update(case.env)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # a step runs as dvc.yaml runs it: python -m components STEP ...
    module, _, step = case.module.rpartition(".")
    cmd = ["-m", "components", step] if module == "components.steps" else ["-m", case.module]
    return subprocess.run(
        [sys.executable, *cmd, *case.args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("make_case", CASES, ids=[c.__name__ for c in CASES])
def test_bad_input_gives_one_readable_line(make_case: Callable[[Path], Run], tmp_path: Path):
    case = make_case(tmp_path)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    proc = _run(case, tmp_path)

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for part in case.expect:
        assert part in errors[0], f"{part!r} not in {errors[0]!r}"
    assert "params.yaml" not in errors[0], "the message must name the params file given"
    assert "object at 0x" not in errors[0], "no Python object reprs in an error line"

    # nothing that looks like a finished output, and no temporary left behind
    if case.out is not None:
        assert not (case.out / "manifest.json").exists()
    after = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert after == before, f"files created: {sorted(set(after) - set(before))}"
