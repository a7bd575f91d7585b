"""The image_folder task's ResNet blocks (components/tasks/resnet.py): paddle.vision's network
with a residual add QAT quantizes. The fp32 network is paddle.vision's, parameter for parameter
and answer for answer; the exported int8 program fake-quantizes both inputs of every residual
add (an IR property, the same on every CPU; what OpenVINO then runs in int8 on this CPU is
``make bench``'s layer table)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import numpy as np
import paddle
import pytest

from components.tasks.image_folder import ImageFolderTask

SIZE = 32


def _resnet18(quantizable: bool) -> paddle.nn.Layer:
    from paddle.vision import models

    from components.tasks.resnet import quantizable_residual_adds

    paddle.seed(0)
    model = models.resnet18(pretrained=False, num_classes=3)
    if quantizable:
        assert quantizable_residual_adds(model) == 8  # ResNet18: 4 stages of 2 blocks
    return model


def test_the_blocks_keep_paddle_visions_parameters_and_fp32_answers():
    ours, theirs = _resnet18(True), _resnet18(False)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)  # the same names: paddle.vision's weights load as they are
    for name, value in reference.items():
        np.testing.assert_array_equal(mine[name].numpy(), value.numpy(), err_msg=name)
    ours.eval(), theirs.eval()
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((4, 3, SIZE, SIZE)), "float32")
    np.testing.assert_allclose(ours(x).numpy(), theirs(x).numpy(), rtol=1e-6, atol=1e-6)


def _residual_adds_fed_by_fake_quant(xml: Path) -> Counter[tuple[str, ...]]:
    """The OpenVINO IR's Add layers by the kinds of layer that feed them."""
    root = ET.parse(xml).getroot()
    kinds = {layer.get("id"): layer.get("type") for layer in root.iter("layer")}
    feeds: dict[str, list[str]] = {}
    for edge in root.iter("edge"):
        feeds.setdefault(edge.get("to-layer"), []).append(kinds[edge.get("from-layer")])
    return Counter(tuple(sorted(feeds.get(i, []))) for i, k in kinds.items() if k == "Add")


def _int8_ir(model: paddle.nn.Layer, out: Path) -> Path:
    """The qat step's int8 export of ``model`` (its quantizer, calibrated by a few
    training-mode forward passes on generated images, as make bench does)."""
    from components.ml.training.quantization import freeze_batch_norm, quantizer, write_bundle
    from components.steps.qat import QatParams

    spec = [paddle.static.InputSpec([-1, 3, SIZE, SIZE], "float32", "image")]
    quant = quantizer(QatParams())
    model.train()
    quant.quantize(model)
    freeze_batch_norm(model)
    rng = np.random.default_rng(1)
    with paddle.no_grad():
        for _ in range(2):
            model(paddle.to_tensor(rng.standard_normal((4, 3, SIZE, SIZE)), "float32"))
    model.eval()
    write_bundle(out, lambda p: quant.save_quantized_model(model, str(p), input_spec=spec))
    return out / "openvino" / "model.xml"


@pytest.mark.parametrize("quantizable", [True, False], ids=["ours", "paddle-vision"])
def test_qat_fake_quantizes_both_inputs_of_every_residual_add(quantizable, tmp_path):
    if quantizable:  # the network as the task builds it
        task = ImageFolderTask.from_options({"arch": "resnet18", "image_size": [SIZE, SIZE]})
        model = task.build_model(3)
    else:
        model = _resnet18(False)
    adds = _residual_adds_fed_by_fake_quant(_int8_ir(model, tmp_path / "int8"))
    both = adds[("FakeQuantize", "FakeQuantize")]
    # ours: the 8 residual adds (the other Add is the classifier's bias); paddle.vision's: none
    assert both == (8 if quantizable else 0), adds
