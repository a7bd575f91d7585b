"""int8 (QAT) vs fp32 on a ResNet in the CPU serving runtime (OpenVINO), side by side.

Builds a random-initialised ``paddle.vision`` ResNet at 224x224, exports the fp32 model and
its int8 twin through the same code the ``qat`` step uses (fake-quant inserted by
``components.steps.qat.quantizer``, activation scales set by a few training-mode forward passes on
generated images, ``save_quantized_model``, OpenVINO IR), then times both in one process,
interleaved, at each batch size and thread count. Weights are random: this measures size and
speed, not accuracy.

    .venv/bin/python bench/qat_resnet.py --arch resnet50
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.ml.modelio import save_legacy  # noqa: E402
from components.ml.ov_runtime import OVPredictor  # noqa: E402
from components.steps.qat import QatParams, _freeze_batch_norm, quantizer, write_bundle  # noqa: E402

log = logging.getLogger("bench")


def sizes(bundle: Path) -> dict[str, int]:
    def size(*names: str) -> int:
        return sum((bundle / n).stat().st_size for n in names)

    return {
        "paddle": size("paddle/model.pdmodel", "paddle/model.pdiparams"),
        "openvino": size("openvino/model.xml", "openvino/model.bin"),
        "openvino_weights": size("openvino/model.bin"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50", choices=["resnet18", "resnet34", "resnet50"])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per cell (median)")
    parser.add_argument("--calibration-batches", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)

    from paddle.vision import models

    paddle.seed(0)
    model = getattr(models, args.arch)(pretrained=False)
    model.eval()
    spec = [paddle.static.InputSpec([-1, 3, args.image_size, args.image_size], "float32", "image")]
    rng = np.random.default_rng(0)

    def images(n: int) -> np.ndarray:
        return rng.standard_normal((n, 3, args.image_size, args.image_size)).astype(np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        fp32_dir, int8_dir = Path(tmp) / "fp32", Path(tmp) / "int8"
        log.info("exporting fp32 %s", args.arch)
        write_bundle(fp32_dir, lambda p: save_legacy(model, spec, p))

        log.info("inserting fake-quant and calibrating activation scales")
        quant = quantizer(QatParams())
        model.train()
        quant.quantize(model)
        _freeze_batch_norm(model)
        with paddle.no_grad():
            for _ in range(args.calibration_batches):
                model(paddle.to_tensor(images(8)))
        model.eval()
        write_bundle(int8_dir, lambda p: quant.save_quantized_model(model, str(p), input_spec=spec))

        size = {"fp32": sizes(fp32_dir), "int8": sizes(int8_dir)}
        rows, precisions = [], {}
        for threads in args.threads:
            predictors = {
                k: OVPredictor(d / "openvino" / "model.xml", threads=threads)
                for k, d in (("fp32", fp32_dir), ("int8", int8_dir))
            }
            precisions = predictors["int8"].precision_by_layer_type()
            for bs in args.batch_sizes:
                x = [images(bs)]
                ms = {}
                for _ in range(2):  # interleave: each model warms up, then both are timed
                    for k, p in predictors.items():
                        ms[k] = p.latency_ms(x, warmup=1, repeats=args.repeats)
                rows.append(
                    {
                        "threads": threads,
                        "batch": bs,
                        "fp32_ms": ms["fp32"],
                        "int8_ms": ms["int8"],
                        "ratio": ms["int8"] / ms["fp32"],
                    }
                )
                log.info(
                    "threads %d batch %d: fp32 %.2f ms, int8 %.2f ms",
                    threads,
                    bs,
                    ms["fp32"],
                    ms["int8"],
                )

    lines = [
        f"{args.arch} {args.image_size}x{args.image_size}, OpenVINO CPU, f32 precision hint",
        "",
        "size (bytes)          fp32         int8    ratio",
    ]
    for fmt in ("paddle", "openvino", "openvino_weights"):
        f, i = size["fp32"][fmt], size["int8"][fmt]
        lines.append(f"{fmt:<16} {f:>12,} {i:>12,}    {i / f:.3f}")
    lines += ["", "threads  batch    fp32 ms    int8 ms    int8/fp32"]
    for r in rows:
        lines.append(
            f"{r['threads']:>7}  {r['batch']:>5}  {r['fp32_ms']:>9.2f}  "
            f"{r['int8_ms']:>9.2f}    {r['ratio']:.3f}"
        )
    fp32_layers = sorted(k for k, v in precisions.items() if "f32" in v and "i8" not in v)
    lines += ["", f"int8 model layers still in f32 only: {', '.join(fp32_layers) or 'none'}"]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "arch": args.arch,
                    "size": size,
                    "latency": rows,
                    "int8_layer_precisions": precisions,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
