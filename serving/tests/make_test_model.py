"""Writes the small real model that openvino_backend_test runs against (a ctest fixture).

The digits task's network (``components.tasks``, the LeNet the pipeline serves) with seeded
random weights, saved the way the export step saves it:

- ``legacy/model.pdmodel`` + ``.pdiparams``: the legacy Paddle program
  (``components.ml.training.modelio.save_legacy``), read by the OpenVINO backend's Paddle frontend;
- ``ir/model.xml`` + ``.bin``: the same model converted to OpenVINO IR (the IR reader path the
  int8 variant uses);
- ``signature.json`` in the export step's format (formats ``legacy`` and ``ir``);
- ``reference.json``: a few inputs and the dygraph model's logits for them.

    python serving/tests/make_test_model.py --out build/serving/test_model

CMake registers it as the fixture ``openvino_test_model`` with the interpreter
``-DPython3_EXECUTABLE`` names (``make serving`` passes the project's venv).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("GLOG_minloglevel", "2")
warnings.filterwarnings("ignore", message="No ccache found")

SAMPLES = 4
NUM_CLASSES = 10


def build(out: Path) -> None:
    import numpy as np
    import openvino as ov
    import paddle

    from components.ml.training.modelio import save_legacy
    from components.tasks import get_task

    task = get_task("digits", {})
    paddle.seed(0)
    model = task.build_model(NUM_CLASSES)
    model.eval()

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_legacy(model, task.paddle_input_specs(), tmp / "legacy" / "model")

    ov_model = ov.Core().read_model(str(tmp / "legacy" / "model.pdmodel"))
    (tmp / "ir").mkdir()
    ov.save_model(ov_model, str(tmp / "ir" / "model.xml"), compress_to_fp16=False)
    runtime_names = {
        "input_names": [p.get_any_name() for p in ov_model.inputs],
        "output_names": [p.get_any_name() for p in ov_model.outputs],
    }
    signature = {
        "task": task.name,
        "inputs": [s.to_json() for s in task.input_specs()],
        "outputs": [s.to_json() for s in task.output_specs(NUM_CLASSES)],
        "formats": {
            "legacy": {
                "program": "legacy/model.pdmodel",
                "params": "legacy/model.pdiparams",
                **runtime_names,
            },
            "ir": {"program": "ir/model.xml", "params": "ir/model.bin", **runtime_names},
        },
        "label_names": [str(i) for i in range(NUM_CLASSES)],
        "paddle_version": paddle.__version__,
    }
    (tmp / "signature.json").write_text(json.dumps(signature, indent=2))

    shape = [SAMPLES, *task.input_specs()[0].shape[1:]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with paddle.no_grad():
        logits = model(paddle.to_tensor(x)).numpy()
    reference = {
        "input": {"shape": list(x.shape), "data": x.ravel().tolist()},
        "output": {"shape": list(logits.shape), "data": logits.ravel().tolist()},
    }
    (tmp / "reference.json").write_text(json.dumps(reference))

    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        import openvino  # noqa: F401
        import paddle  # noqa: F401
    except ImportError as exc:
        sys.stderr.write(
            f"error: {sys.executable} cannot import {exc.name}: configure serving/ with "
            "-DPython3_EXECUTABLE=<the project's .venv/bin/python> (make serving does)\n"
        )
        return 1
    build(args.out.resolve())
    sys.stdout.write(f"wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
