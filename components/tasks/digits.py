"""Handwritten digits: a LeNet-style CNN on single-channel images resized to 28x28."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Any

import paddle
from paddle import nn
from pydantic import Field, model_validator

from components.core.config import from_dict, params_model
from components.tasks.vision import (
    ImageClassificationTask,
    Mean,
    Shift,
    Std,
    check_channels,
)

# conv3(pad 1) -> pool2 -> conv5 -> pool2 leaves (H // 2 - 4) // 2 rows: at least 1 needs H >= 12
MIN_IMAGE_SIZE = 12
# [H, W]
ImageSize = Annotated[
    list[Annotated[int, Field(ge=MIN_IMAGE_SIZE)]], Field(min_length=2, max_length=2)
]
Width = Annotated[int, Field(ge=1)]


@params_model
class DigitsOptions:
    image_size: ImageSize = field(default_factory=lambda: [28, 28])
    mean: Mean = field(default_factory=lambda: [0.5])
    std: Std = field(default_factory=lambda: [0.5])
    # two widths
    conv_channels: Annotated[list[Width], Field(min_length=2, max_length=2)] = field(
        default_factory=lambda: [6, 16]
    )
    hidden: list[Width] = field(default_factory=lambda: [120, 84])
    augment_shift: Shift = 0  # training-time random shift in pixels (after resize)

    @model_validator(mode="after")
    def _channels(self) -> DigitsOptions:
        check_channels(self.mean, self.std)
        return self


class LeNet(nn.Layer):
    """LeNet-5 shape: conv-pool-conv-pool-fc-fc-fc, sized for the configured input."""

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        image_size: tuple[int, int],
        conv_channels: list[int],
        hidden: list[int],
    ):
        super().__init__()
        c1, c2 = conv_channels
        self.features = nn.Sequential(
            nn.Conv2D(in_channels, c1, 3, stride=1, padding=1),
            nn.ReLU(),
            nn.MaxPool2D(2, 2),
            nn.Conv2D(c1, c2, 5, stride=1, padding=0),
            nn.ReLU(),
            nn.MaxPool2D(2, 2),
        )
        h, w = image_size
        fh, fw = ((h // 2) - 4) // 2, ((w // 2) - 4) // 2
        layers: list[nn.Layer] = []
        width = c2 * fh * fw
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.classifier = nn.Sequential(*layers)

    def forward(self, image: paddle.Tensor) -> paddle.Tensor:
        x = self.features(image)
        x = paddle.flatten(x, 1)
        return self.classifier(x)


class DigitsTask(ImageClassificationTask):
    name = "digits"

    def __init__(self, options: DigitsOptions):
        super().__init__(
            tuple(options.image_size), options.mean, options.std, options.augment_shift
        )
        self.options = options

    @classmethod
    def from_options(
        cls, options: dict[str, Any], *, where: str = "params.yaml: task.options"
    ) -> DigitsTask:
        return cls(from_dict(DigitsOptions, options, where=where))

    def build_model(self, num_classes: int) -> nn.Layer:
        return LeNet(
            num_classes,
            self.channels,
            self.image_size,
            self.options.conv_channels,
            self.options.hidden,
        )
