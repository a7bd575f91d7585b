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

from components.core.artifacts import write_json

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
