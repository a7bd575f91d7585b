"""int8 (QAT) vs fp32 on a ResNet in the CPU serving runtime (OpenVINO), side by side.

Builds a random-initialised ``paddle.vision`` ResNet at 224x224 with the image_folder task's
blocks (``components/tasks/resnet.py``: residual adds QAT quantizes; ``--blocks paddle-vision``
for paddle.vision's own), exports the fp32 model and its int8 twin through the same code the
``qat`` step uses (fake-quant inserted by ``components.ml.training.quantization.quantizer``,
activation scales set by a few training-mode forward passes on generated images,
``save_quantized_model``, OpenVINO IR), then times both in one process,
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

from components.ml.serving.ov_runtime import OVPredictor  # noqa: E402
from components.ml.training.modelio import save_legacy  # noqa: E402
from components.ml.training.quantization import (  # noqa: E402
    freeze_batch_norm,
    quantizer,
    write_bundle,
)
from components.steps.qat import QatParams  # noqa: E402
from components.tasks.resnet import quantizable_residual_adds  # noqa: E402

log = logging.getLogger("bench")


def sizes(bundle: Path) -> dict[str, int]:
    def size(*names: str) -> int:
        return sum((bundle / n).stat().st_size for n in names)

    return {
        "paddle": size("paddle/model.pdmodel", "paddle/model.pdiparams"),
        "openvino": size("openvino/model.xml", "openvino/model.bin"),
        "openvino_weights": size("openvino/model.bin"),
    }


# layers that do arithmetic on the activations (the rest move or reshape them)
COMPUTE = ("Convolution", "FullyConnected", "MatMul", "Eltwise", "Pooling", "Reduce", "Subgraph")


def f32_compute_layers(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    """Of a compiled model's layers, the compute ones that execute in f32: {kind: count}."""
    return {
        kind: by["f32"] for kind, by in counts.items() if kind.startswith(COMPUTE) and by.get("f32")
    }


def _counts(by: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in by.items())


def latency_hint_ms(xml: Path, x: np.ndarray, repeats: int) -> float:
    """Median batch-1 latency with OpenVINO's LATENCY performance hint (f32 precision hint,
    like the server): the runtime's own best single-request setting on this CPU."""
    import time

    import openvino as ov

    compiled = ov.Core().compile_model(
        str(xml), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    )
    request = compiled.create_infer_request()
    for _ in range(3):
        request.infer([x])
    times = []
    for _ in range(max(repeats, 5) * 4):
        start = time.perf_counter()
        request.infer([x])
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50", choices=["resnet18", "resnet34", "resnet50"])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per cell (median)")
    parser.add_argument("--calibration-batches", type=int, default=4)
    parser.add_argument(
        "--blocks",
        default="quantizable",
        choices=["quantizable", "paddle-vision"],
        help="quantizable: the image_folder task's blocks (components/tasks/resnet.py), whose "
        "residual add QAT quantizes; paddle-vision: the blocks as paddle.vision ships them",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)

    from paddle.vision import models

    paddle.seed(0)
    model = getattr(models, args.arch)(pretrained=False)
    if args.blocks == "quantizable":
        log.info("residual adds as quantizable layers: %d blocks", quantizable_residual_adds(model))
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
        freeze_batch_norm(model)
        with paddle.no_grad():
            for _ in range(args.calibration_batches):
                model(paddle.to_tensor(images(8)))
        model.eval()
        write_bundle(int8_dir, lambda p: quant.save_quantized_model(model, str(p), input_spec=spec))

        size = {"fp32": sizes(fp32_dir), "int8": sizes(int8_dir)}
        rows: list[dict] = []
        counts: dict[str, dict[str, dict[str, int]]] = {}
        for threads in args.threads:
            predictors = {
                k: OVPredictor(d / "openvino" / "model.xml", threads=threads)
                for k, d in (("fp32", fp32_dir), ("int8", int8_dir))
            }
            counts = {k: p.precision_counts() for k, p in predictors.items()}
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

        # the runtime's best batch-1 latency: the LATENCY hint, threads and streams its own
        best = {
            k: latency_hint_ms(d / "openvino" / "model.xml", images(1), args.repeats)
            for k, d in (("fp32", fp32_dir), ("int8", int8_dir))
        }

    lines = [
        f"{args.arch} {args.image_size}x{args.image_size} ({args.blocks} blocks), OpenVINO CPU, "
        "f32 precision hint",
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
    lines += [
        "",
        f"LATENCY hint, batch 1 (the runtime picks threads and streams): fp32 "
        f"{best['fp32']:.2f} ms, int8 {best['int8']:.2f} ms, {best['int8'] / best['fp32']:.3f}",
        "",
        "layers by the precision they execute in (compiled model; fp32 model | int8 model)",
    ]
    for kind in sorted(set(counts.get("fp32", {})) | set(counts.get("int8", {}))):
        f = _counts(counts["fp32"].get(kind, {}))
        i = _counts(counts["int8"].get(kind, {}))
        lines.append(f"  {kind:<24} {f:<24} | {i}")
    f32_ops = f32_compute_layers(counts.get("int8", {}))
    lines += ["", f"int8 model: compute layers still in f32: {_counts(f32_ops) or 'none'}"]
    print("\n".join(lines))
    worst = max(r["ratio"] for r in rows)
    cells = " ".join(f"int8_vs_fp32_t{r['threads']}_b{r['batch']}={r['ratio']:.3f}" for r in rows)
    print(
        f"{cells} int8_vs_fp32_worst={worst:.3f} latency_hint_b1_fp32_ms={best['fp32']:.3f} "
        f"latency_hint_b1_int8_ms={best['int8']:.3f} int8_f32_compute_layers="
        f"{sum(f32_ops.values())}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "arch": args.arch,
                    "size": size,
                    "latency": rows,
                    "layer_precisions": counts,
                    "latency_hint_b1_ms": best,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
