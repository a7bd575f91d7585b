"""``paddle-mlops registry status|promote|rollback``: the champion by hand.

The tracking store and its retries: ``components.commands.connection`` (a command run by hand
gives up on a dead server in seconds; ``params.yaml``'s ``registry.retry`` is the policy of
the pipeline's steps, which ride out a server restart). The registry itself:
``components.tracking.registry``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from components.commands.connection import add_tracking_flags, open_tracking
from components.core.artifacts import StepError
from components.core.config import load_params, section
from components.kernel.cli import ArgumentParser, run_cli
from components.tasks import task_from_params
from components.tracking.registry import (
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    Registry,
    RegistryParams,
    model_name,
    version_label,
)


def _format_status(status: dict[str, Any]) -> str:
    lines = [f"model {status['model']}  (tracking URI {status.get('tracking_uri', '?')})"]
    for alias in (CHAMPION, CHALLENGER, PREVIOUS):
        entry = status.get(alias)
        if entry is None:
            lines.append(f"  {alias:<18} -")
            continue
        t = entry["tags"]
        lines.append(
            f"  {alias:<18} v{entry['version']}  accuracy {t.get('accuracy', '?')}  "
            f"blessed {t.get('blessed', '?')}  git {t.get('git_sha', '?')[:12]}  "
            f"data {t.get('data_sha256', '?')[:12]}  params {t.get('params_sha256', '?')[:12]}  "
            f"ge {t.get('ge_success', '?')}  qat_gate {t.get('qat_gate_passed', '?')}"
        )
    for event in status["history"][-5:]:
        lines.append(
            f"  {event['at']}  {event['action']:<8} v{event['version']} "
            f"(was {version_label(event['previous'])})"
            f"{'  FORCED: ' + event['reason'] if event.get('forced') else ''}"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops registry status|promote|rollback``: the champion by hand."""
    parser = ArgumentParser(
        prog="paddle-mlops registry",
        description="The registered model's champion: show it, promote a version by hand "
        "(refused unless blessed, or --force with a recorded --reason), roll back.",
    )
    parser.add_argument("--params", default="params.yaml")
    add_tracking_flags(parser)
    parser.add_argument("--model-name", default=None, help="default: registry.model_name")
    sub = parser.add_subparsers(dest="command", required=True)
    p_status = sub.add_parser("status", help="champion, challenger, history")
    p_status.add_argument("--json", action="store_true")
    p_promote = sub.add_parser("promote", help="make a version the champion")
    p_promote.add_argument("--version", type=int, default=None, help="default: the challenger")
    p_promote.add_argument("--force", action="store_true", help="promote although not blessed")
    p_promote.add_argument("--reason", default="")
    p_rollback = sub.add_parser("rollback", help="restore the previous champion")
    p_rollback.add_argument("--reason", default="")
    args = parser.parse_args(argv)

    def _go() -> None:
        all_params = load_params(args.params)
        params = section(all_params, "registry", RegistryParams, source=args.params)
        name = args.model_name or model_name(params, task_from_params(all_params))
        store = open_tracking(args)  # its retries, not the steps' registry.retry
        registry = Registry(store.client, name, dataclasses.replace(params, retry=store.retry))
        if not registry.exists():
            raise StepError(f"no registered model '{name}' at tracking URI {store}")
        if args.command == "status":
            status = registry.status() | {"tracking_uri": str(store)}
            out = json.dumps(status, indent=2) + "\n" if args.json else _format_status(status)
        elif args.command == "promote":
            version = args.version or registry.aliases().get(CHALLENGER)
            if version is None:
                raise StepError(f"{name}: no --version given and no '{CHALLENGER}' alias")
            done = registry.promote(version, force=args.force, reason=args.reason)
            out = json.dumps(done | {"tracking_uri": str(store)})
        else:
            out = json.dumps(registry.rollback(reason=args.reason) | {"tracking_uri": str(store)})
        sys.stdout.write(out.rstrip("\n") + "\n")

    return run_cli(_go)
