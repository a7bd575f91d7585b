"""Handwritten digits: a LeNet-style CNN on single-channel images resized to 28x28."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, model_validator

from components.core.config import from_dict, params_model
from components.tasks.vision import (
    ImageClassificationTask,
    Mean,
    Shift,
    Std,
    check_channels,
)

if TYPE_CHECKING:
    from paddle import nn

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
        from components.tasks.digits_net import LeNet

        return LeNet(
            num_classes,
            self.channels,
            self.image_size,
            self.options.conv_channels,
            self.options.hidden,
        )
