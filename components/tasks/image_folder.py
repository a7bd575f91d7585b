"""Image folders (one sub-folder per class) classified with a ResNet from paddle.vision."""

from __future__ import annotations

import logging
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from components.core.artifacts import StepError
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

log = logging.getLogger(__name__)

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


# [H, W]
ImageSize = Annotated[list[Annotated[int, Field(ge=32)]], Field(min_length=2, max_length=2)]


@params_model
class ImageFolderOptions:
    arch: Literal["resnet18", "resnet34", "resnet50"] = "resnet50"
    image_size: ImageSize = field(default_factory=lambda: [224, 224])
    mean: Mean = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: Std = field(default_factory=lambda: list(IMAGENET_STD))
    # ImageNet weights: true downloads them through paddle.vision (needs network access);
    # pretrained_weights names a local .pdparams file instead. Never used in tests.
    pretrained: bool = False
    pretrained_weights: str | None = None
    augment_shift: Shift = 0

    @model_validator(mode="after")
    def _channels(self) -> ImageFolderOptions:
        check_channels(self.mean, self.std)
        return self


class ImageFolderTask(ImageClassificationTask):
    name = "image_folder"

    def __init__(self, options: ImageFolderOptions, where: str = "params.yaml: task.options"):
        super().__init__(
            tuple(options.image_size), options.mean, options.std, options.augment_shift
        )
        self.options = options
        self.where = where  # "<params file>: task.options", for messages

    @classmethod
    def from_options(
        cls, options: dict[str, Any], *, where: str = "params.yaml: task.options"
    ) -> ImageFolderTask:
        return cls(from_dict(ImageFolderOptions, options, where=where), where)

    def build_model(self, num_classes: int) -> nn.Layer:
        import paddle
        from paddle import nn
        from paddle.vision import models

        factory = getattr(models, self.options.arch)
        if self.options.pretrained and not self.options.pretrained_weights:
            try:
                model = factory(pretrained=True)
            except Exception as exc:  # download errors surface as many different types
                raise StepError(
                    f"{self.where}.pretrained: ImageNet weights for {self.options.arch} are not "
                    f"reachable ({type(exc).__name__}); set pretrained: false or "
                    "pretrained_weights: /path/to/weights.pdparams"
                ) from exc
        else:
            model = factory(pretrained=False)
        if self.options.pretrained_weights:
            path = Path(self.options.pretrained_weights)
            if not path.exists():
                raise StepError(f"{self.where}.pretrained_weights: {path} not found")
            model.set_state_dict(paddle.load(str(path)))
        if self.channels != 3:
            model.conv1 = nn.Conv2D(self.channels, 64, 7, stride=2, padding=3, bias_attr=False)
        # ImageNet head -> this data set's classes
        model.fc = nn.Linear(model.fc.weight.shape[0], num_classes)
        # the residual adds as layers QAT quantizes (same parameters, same fp32 arithmetic)
        from components.tasks.resnet import quantizable_residual_adds

        quantizable_residual_adds(model)
        return model
