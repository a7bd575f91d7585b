"""The digits task's network (:mod:`components.tasks.digits` builds it): apart from the task,
so that reading the task's options and data format never imports paddle."""

from __future__ import annotations

import paddle
from paddle import nn


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
