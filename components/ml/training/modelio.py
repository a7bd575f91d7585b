"""Model I/O shared by the steps: save a Paddle program.

Library layer: imported by steps, imports no step. Rebuilding a task's trained model (it
needs the task): :mod:`components.tasks.trained`.
"""

from __future__ import annotations

from pathlib import Path

import paddle


def save_legacy(model: paddle.nn.Layer, spec: list, prefix: str | Path) -> None:
    """``paddle.jit.save`` in the legacy ProgramDesc format (``prefix.pdmodel``)."""
    with paddle.pir_utils.OldIrGuard():
        paddle.jit.save(model, str(prefix), input_spec=spec)
