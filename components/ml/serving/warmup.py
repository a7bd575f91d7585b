"""The bundle's warm-up samples: what the C++ server runs before it reports ready.

A compiled model's first inference at each batch size is slow (digits in OpenVINO: 3-25 ms
against 0.1 ms warm; Intel Xeon with AMX, 2 vCPU, 2026-12-04). The server therefore runs every
batch size it will form, max batch size down to 1, on each worker's own thread, before it
reports ready, at start and before a ``load`` swaps a new version in
(``serving/src/model.cc: Model::WarmInstance``). Its inputs come from the bundle, like golden
samples: ``export`` writes the first ``export.warmup_samples`` validation samples, already
preprocessed into the model's inputs, and ``package`` copies them with the rest::

    warmup.json            {"samples": N, "inputs": [{"name": "image", "file": "warmup/0.bin"}]}
    warmup/0.bin           N samples of input 0, raw little-endian, C order

Names, dtypes and per-sample shapes are those of ``signature.json: inputs`` in its order; the
server tiles the N samples to fill each batch. No file (``warmup_samples: 0``): no warm-up.

Library layer: imported by steps, imports no step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from components.core.artifacts import StepError, read_json, write_json

WARMUP_FILE = "warmup.json"  # kWarmupFile in serving/src/model.cc


def write(bundle_dir: str | Path, names: list[str], inputs: list[np.ndarray]) -> Path:
    """``bundle_dir/warmup.json`` and one raw file per input (``inputs`` in signature order,
    dim 0 the samples). The files are written inside a bundle that is itself being written
    atomically (``export``'s temporary directory)."""
    bundle_dir = Path(bundle_dir)
    if len(names) != len(inputs) or not inputs:
        raise ValueError(f"warm-up: {len(inputs)} arrays for the inputs {names}")
    samples = {len(x) for x in inputs}
    if len(samples) != 1:
        raise ValueError(f"warm-up: inputs with different sample counts {sorted(samples)}")
    entries = []
    (bundle_dir / "warmup").mkdir(parents=True, exist_ok=True)
    for i, (name, array) in enumerate(zip(names, inputs, strict=True)):
        data = np.ascontiguousarray(array)
        if sys.byteorder != "little":
            data = data.byteswap()
        rel = f"warmup/{i}.bin"
        (bundle_dir / rel).write_bytes(data.tobytes())
        entries.append({"name": name, "file": rel})
    return write_json(bundle_dir / WARMUP_FILE, {"samples": samples.pop(), "inputs": entries})


def read_first(bundle_dir: str | Path) -> dict[str, np.ndarray]:
    """The first warm-up sample of a bundle, as a batch of one per input (signature order,
    dtypes and shapes): what the serving-config search sends."""
    bundle_dir = Path(bundle_dir)
    index = bundle_dir / WARMUP_FILE
    if not index.is_file():
        raise StepError(
            f"{index}: missing; the search sends the bundle's warm-up samples "
            "(export.warmup_samples >= 1)"
        )
    specs = {s["name"]: s for s in read_json(bundle_dir / "signature.json")["inputs"]}
    inputs = {}
    for entry in read_json(index)["inputs"]:
        spec = specs[entry["name"]]
        shape = [1, *(int(d) for d in spec["shape"][1:])]
        size = int(np.prod(shape))
        data = np.fromfile(
            bundle_dir / entry["file"], np.dtype(spec["dtype"]).newbyteorder("<"), size
        )
        if data.size != size:
            raise StepError(f"{bundle_dir / entry['file']}: shorter than one sample of {shape[1:]}")
        inputs[entry["name"]] = data.astype(spec["dtype"]).reshape(shape)
    return inputs
