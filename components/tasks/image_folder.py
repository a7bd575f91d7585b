"""Image folders (one sub-folder per class) classified with a ResNet from paddle.vision."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import paddle
from paddle import nn

from components.core.artifacts import StepError
from components.core.config import from_dict
from components.tasks.vision import ImageClassificationTask, check_image_options

log = logging.getLogger(__name__)

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclass(frozen=True)
class ImageFolderOptions:
    arch: Literal["resnet18", "resnet34", "resnet50"] = "resnet50"
    image_size: list[int] = field(default_factory=lambda: [224, 224])
    mean: list[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = field(default_factory=lambda: list(IMAGENET_STD))
    # ImageNet weights: true downloads them through paddle.vision (needs network access);
    # pretrained_weights names a local .pdparams file instead. Never used in tests.
    pretrained: bool = False
    pretrained_weights: str | None = None
    augment_shift: int = 0

    def check(self) -> None:
        check_image_options(self.image_size, self.mean, self.std, self.augment_shift, min_size=32)


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
        return model
