"""judge: promote or roll back a challenger on the evidence of live traffic.

Reads the prediction log (``--log``) of a server running a challenger beside the champion
(``load`` with ``role: challenger``, ``policy: shadow | canary``: docs/monitoring.md), pairs
the two versions' answers by request id, joins the labels fed back (``--labels``), and
decides with ``components.ml.decisions.judging``: a service-level breach rolls back at once; with
labels the blessing's paired rules decide, without them the agreement with the champion;
too little evidence waits.

Then it acts, where told: on the server (``--server URL``: ``POST .../promote`` or ``unload``
of the challenger) and in the registry (``--tracking-uri``, or ``MLFLOW_TRACKING_URI``: a
promotion moves ``champion`` to the challenger's version, a rollback is recorded on the
version and in the champion history, each with its evidence). ``judgement.json`` holds the
verdict, the reasons and the evidence. Exit code 0 for every verdict.

Not a stage of the training DAG: it judges live traffic.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

from components.core.artifacts import StepError, atomic_path, write_json
from components.core.config import params_model
from components.kernel.step import In, Out, Step, Value
from components.ml.data.prediction_log import LogReader, read_labels
from components.ml.decisions.blessing import RegisterParams
from components.ml.decisions.judging import Evidence, JudgeLimits, Judgement, judge
from components.tasks.base import Task
from components.tracking.registry import Registry, RegistryParams, client, registered_name

log = logging.getLogger(__name__)


@params_model
class JudgeParams(JudgeLimits):
    """``judge`` in params.yaml: the verdict's limits, and how much of the log is read."""

    window: int  # the newest paired requests (and challenger answers) judged


def evidence(log_dir: Path, window: int, labels_file: str) -> tuple[Evidence, str, str]:
    """The trial's paired answers (the newest challenger version and its champion), the
    challenger's service record, and the versions: (evidence, champion, challenger). One pass
    over the log; memory holds the newest ``window`` requests."""
    if not log_dir.is_dir():
        raise StepError(f"{log_dir}: no prediction log directory (--log)")
    challenger, champion = "", ""
    answers: deque[tuple[bool, int]] = deque(maxlen=window)  # (5xx, latency) of challenger
    pairs: OrderedDict[str, dict[str, tuple[str, list[int]]]] = OrderedDict()
    for r in LogReader(log_dir):
        if r.role == "champion":
            champion = r.version
        elif r.role == "challenger":
            if r.version != challenger:  # a new trial: the older one's answers are not its
                challenger = r.version
                answers.clear()
            answers.append((r.code >= 500, r.latency_us))
        else:
            continue
        if r.ok and r.top1 is not None:
            pairs.setdefault(r.id, {})[r.role] = (r.version, r.top1)
            pairs.move_to_end(r.id)
            while len(pairs) > window:
                pairs.popitem(last=False)
    if not challenger:
        raise StepError(f"{log_dir}: no challenger answers logged; load one beside the champion")
    ev = Evidence(
        challenger_requests=len(answers),
        challenger_errors=sum(failed for failed, _ in answers),
        challenger_latency_us=[latency for _, latency in answers],
    )
    complete = {
        rid: (both["champion"][1], both["challenger"][1])
        for rid, both in pairs.items()
        if both.get("champion", ("",))[0] == champion
        and both.get("challenger", ("",))[0] == challenger
    }
    labels = read_labels(Path(labels_file), log_dir, complete) if labels_file else {}
    for rid, (ours, theirs) in complete.items():
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            ev.champion.append(int(a))
            ev.challenger.append(int(b))
            got = labels.get(rid)
            ev.labels.append(got[i] if got is not None and i < len(got) else None)
    return ev, champion, challenger


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as res:
            res.read()
    except urllib.error.HTTPError as err:
        raise StepError(f"POST {url}: HTTP {err.code}: {err.read()[:300]!r}") from None
    except OSError as err:
        raise StepError(f"POST {url}: {err}") from None


def act(judgement: Judgement, server: str, model: str, challenger: str) -> dict[str, Any]:
    """The verdict applied to the running server (nothing for ``wait``)."""
    if not server or judgement.action == "wait":
        return {}
    base = f"{server.rstrip('/')}/v2/repository/models/{model}"
    if judgement.action == "promote":
        _post(f"{base}/promote", {})
    else:
        _post(f"{base}/unload", {"parameters": {"role": "challenger"}})
    log.info("judge: server %s: %s of v%s done", server, judgement.action, challenger)
    return {"server": server, "done": judgement.action}


def record(
    judgement: Judgement, tracking_uri: str, name: str, params: RegistryParams, challenger: str
) -> dict[str, Any]:
    """The verdict in the registry, with its evidence (nothing for ``wait``)."""
    if not tracking_uri or judgement.action == "wait":
        return {}
    registry = Registry(client(tracking_uri), name, params)
    reason = "judge on live traffic: " + "; ".join(judgement.reasons)
    version = int(challenger)
    if judgement.action == "promote":
        event = registry.promote(version, reason=reason)
    else:
        event = registry.record_judgement("reject", version, reason)
    return {"registry": name, "event": event}


def run(
    params: JudgeParams,
    register_params: RegisterParams,
    registry_params: RegistryParams,
    task: Task,
    log_dir: str | Path,
    out_dir: str | Path,
    labels_file: str = "",
    server: str = "",
    model_name: str = "",
    tracking_uri: str = "",
) -> Judgement:
    log_dir, out_dir = Path(log_dir), Path(out_dir)
    paired = register_params.limits()
    ev, champion, challenger = evidence(log_dir, params.window, labels_file)
    names = [str(i) for i in range(max([*ev.champion, *ev.challenger, 1]) + 1)]
    judgement = judge(ev, params, paired, names)
    name = model_name or registered_name(registry_params, task.name, task.model_kind)
    line = f"judge: {judgement.action.upper()} {name} v{challenger} (champion v{champion}): " + (
        "; ".join(judgement.reasons)
    )
    (log.warning if judgement.action == "rollback" else log.info)(line)
    doc: dict[str, Any] = {
        "model": name,
        "champion": champion,
        "challenger": challenger,
        "action": judgement.action,
        "reasons": judgement.reasons,
        "evidence": judgement.evidence,
    }
    doc["server"] = act(judgement, server, name, challenger)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    doc["registry"] = record(judgement, uri, name, registry_params, challenger)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        write_json(tmp / "judgement.json", doc)
    return judgement


STEP = Step(
    name="judge",
    doc=__doc__,
    params=JudgeParams,
    sections=("task", "judge", "register", "registry"),
    shared=(
        ("register", "register_params", RegisterParams),
        ("registry", "registry_params", RegistryParams),
    ),
    run=run,
    inputs=(In("log", ".deploy/predictions", "log_dir", help="the server's prediction log dir"),),
    outputs=(Out("judgement", "outputs/judge", "out_dir", help="judgement.json"),),
    values=(
        Value("labels", "labels_file", "", help="fed-back labels, JSON Lines {id, label}"),
        Value("server", "server", "", help="act on this server (http://host:port); default: none"),
        Value("model_name", "model_name", "", help="served/registered name (default: registry's)"),
        Value("tracking_uri", "tracking_uri", "", help="MLflow (default: $MLFLOW_TRACKING_URI)"),
    ),
)
