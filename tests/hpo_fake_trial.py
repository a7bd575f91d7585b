"""A fake trial command for tests/test_hpo_search.py: Katib metric lines from its --set args.

``train.x`` sets the curve (epoch e of E: ``x * (e + 1) / E``), ``train.epochs`` its length.
x >= 0.95 crashes (exit 1, a line on stderr); x < 0.05 blocks after epoch 1 until killed (a
pruned trial); with FAKE_HANG_AFTER=n the trial started after n others blocks until killed.
Every start, epoch and end is appended to the JSON-lines file FAKE_RECORD.
"""

import json
import os
import sys
import time
from datetime import UTC, datetime

from components.core.overrides import parse_set
from components.ml.training.trial_metrics import metric_line

values = dict(parse_set(a) for a in sys.argv[1:] if a.startswith("--set="))
record = os.environ["FAKE_RECORD"]


def note(event: str, **fields: object) -> None:
    with open(record, "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def block() -> None:
    for _ in range(600):  # killed long before: the test fails, not hangs, if it is not
        time.sleep(0.2)


with open(record, encoding="utf-8") as f:
    started = (
        sum(json.loads(line)["event"] == "start" for line in f) if os.path.getsize(record) else 0
    )
note("start", params=values, trial=os.environ.get("PADDLE_MLOPS_TRIAL"))
if "FAKE_HANG_AFTER" in os.environ and started >= int(os.environ["FAKE_HANG_AFTER"]):
    block()
x, epochs = float(values["train.x"]), int(values.get("train.epochs", 4))
if x >= 0.95:
    print(f"boom: x={x} is flagged", file=sys.stderr)
    sys.exit(1)
for epoch in range(epochs):
    # recorded before its metric line: once the driver reads the line it may prune (SIGTERM)
    # at once, and a record written after could be cut off by the signal
    note("epoch", epoch=epoch)
    print(
        metric_line(epoch, {"val_score": x * (epoch + 1) / epochs}, datetime.now(UTC)), flush=True
    )
    print(f"progress val_score={x}", file=sys.stderr)  # like tqdm's postfix: not read
    if x < 0.05 and epoch >= 1:
        block()
note("end")
