"""A task's trained model, rebuilt from what train wrote (``model_meta.json``, the weights).

It lives with the tasks (it asks a :class:`Task` to build the model and load its assets),
above ``components.ml``, so ``ml`` never imports a task. Imported by steps (export, qat),
imports no step. Saving a Paddle program (no task involved): :mod:`components.ml.training.modelio`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import paddle

from components.core.artifacts import StepError, read_json
from components.tasks.base import Task


def load_trained(task: Task, train_dir: str | Path) -> tuple[paddle.nn.Layer, dict[str, Any]]:
    """Rebuild the task's model and load the trained weights from ``train_dir``."""
    train_dir = Path(train_dir)
    meta = read_json(train_dir / "model_meta.json")
    task.load_assets(train_dir)  # what its preprocessing fitted (a vocabulary, say)
    model = task.build_model(int(meta["num_classes"]))
    weights = train_dir / "model.pdparams"
    if not weights.exists():
        raise StepError(f"{weights}: trained weights not found (run train first)")
    missing, unexpected = model.set_state_dict(paddle.load(str(weights)))
    if missing or unexpected:
        raise StepError(
            f"{weights}: weights do not fit the task's model (missing {missing}, "
            f"unexpected {unexpected}); were task.options changed after training?"
        )
    model.eval()
    return model, meta
