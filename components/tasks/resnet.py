"""paddle.vision's ResNet blocks with a residual add that quantization-aware training can
quantize (the image_folder task's network, ``bench/qat_resnet.py``).

paddle.vision's blocks add the shortcut in place (``out += identity``). The qat step's quantizer
(``ImperativeQuantAware``, ONNX format) fake-quantizes the inputs of convolutions and linear
layers only, so that add stays a float operation between two dequantized tensors, and OpenVINO
runs it as an f32 ``Eltwise`` layer between int8 convolutions: 12 of ResNet50's 16 adds were
left in f32 (``make bench``, docs/qat.md).

Here the add is a layer of its own, :class:`ResidualAdd`. Once the quantizer has wrapped a
block's convolutions, the block's add fake-quantizes both of its inputs too (8 bits, moving
average of the absolute maximum, as the convolutions' inputs), calibrated by the same
fine-tuning. The exported int8 program then holds a quantize/dequantize pair on each input of
every residual add, and OpenVINO can fuse the add into the int8 convolution before it.

The fp32 network is the same: the same parameters under the same names (paddle.vision's
pretrained weights load as they are) and the same arithmetic (``x + y``). The quantizers exist
only in the quantized model; they are created by the first training-mode forward pass after
quantization (the fine-tuning's or the calibration's).
"""

from __future__ import annotations

import paddle
from paddle import nn
from paddle.nn.quant.quant_layers import FakeQuantMovingAverageAbsMax, QuantizedConv2D
from paddle.vision.models.resnet import BasicBlock, BottleneckBlock

ACTIVATION_BITS = 8  # as the quantizer's activation_bits (its default)


class ResidualAdd(nn.Layer):
    """``x + y``; with ``quantized``, both inputs fake-quantized first."""

    def __init__(self, moving_rate: float = 0.9) -> None:
        super().__init__()
        self.moving_rate = moving_rate
        self.quant: nn.LayerList | None = None  # one quantizer per input, created together

    def _quantizer(self, which: str) -> nn.Layer:
        return FakeQuantMovingAverageAbsMax(
            name=f"{self.full_name()}.{which}", moving_rate=self.moving_rate,
            quant_bits=ACTIVATION_BITS,
        )  # fmt: skip

    def forward(self, x: paddle.Tensor, y: paddle.Tensor, quantized: bool = False) -> paddle.Tensor:
        if quantized and self.quant is None and self.training:
            # the first forward pass of the fine-tuning: the block's convolutions were wrapped
            self.quant = nn.LayerList([self._quantizer("x"), self._quantizer("y")])
        if quantized and self.quant is not None:
            x, y = self.quant[0](x), self.quant[1](y)
        return x + y


def _quantized(block: nn.Layer) -> bool:
    """Whether the quantizer has wrapped the block's convolutions (the qat step's model: a
    ``QuantizedConv2D``, itself inside the layer that records its output scale)."""
    conv = block.conv1
    return any(isinstance(layer, QuantizedConv2D) for layer in (conv, *conv.sublayers()))


class QuantizableBasicBlock(BasicBlock):
    residual_add: ResidualAdd

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(self.residual_add(out, identity, _quantized(self)))


class QuantizableBottleneckBlock(BottleneckBlock):
    residual_add: ResidualAdd

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(self.residual_add(out, identity, _quantized(self)))


_VARIANTS = {BasicBlock: QuantizableBasicBlock, BottleneckBlock: QuantizableBottleneckBlock}


def quantizable_residual_adds(model: nn.Layer) -> int:
    """Turn every paddle.vision ResNet block of ``model`` into its variant above, in place
    (parameters untouched); how many blocks there were."""
    count = 0
    for layer in model.sublayers():
        variant = _VARIANTS.get(type(layer))
        if variant is None:
            continue
        layer.__class__ = variant
        layer.residual_add = ResidualAdd()
        count += 1
    return count
