"""The aliases of a registered model (champion, challenger, previous-champion) and how one is
written: riding out two pipelines' first writes of one alias at the same instant.

Library layer: imported by the registry, register and promote.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from components.core.artifacts import StepError
from components.core.retry import SYSTEM_CLOCK, BackoffParams, Clock, retry_call

log = logging.getLogger("components.tracking.registry")  # the registry's logger, as before

CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous-champion"


# a concurrent first write of the same alias: MLflow's SQL store reads, then inserts, so two
# writers can both insert; the loser's error names the database's unique-key violation
_ALIAS_RACE = re.compile(
    r"IntegrityError|UniqueViolation|UNIQUE constraint|duplicate key|Duplicate entry", re.I
)


def alias_race_default() -> BackoffParams:
    # the waits between those writes (the loser's row exists at once: short waits)
    return BackoffParams(first_s=0.05, max_s=1.0, attempts=5)


def set_alias(
    client: Any,
    name: str,
    alias: str,
    version: int | str,
    attempts: int | None = None,
    clock: Clock = SYSTEM_CLOCK,
    *,
    backoff: BackoffParams | None = None,
) -> None:
    """Point ``alias`` of ``name`` at ``version``, as ``set_registered_model_alias`` does, but
    riding out the race of two first writes of one alias (two pipelines registering at once):
    MLflow answers the loser with BAD_REQUEST and a unique-key violation; by then the row
    exists, so the next attempt updates it (waits and attempts: ``backoff``, default
    ``registry.alias_backoff``'s default; ``attempts`` replaces its count). Any other error is
    raised at once."""
    from mlflow.exceptions import MlflowException

    def _race(exc: BaseException) -> bool:
        return isinstance(exc, MlflowException) and bool(_ALIAS_RACE.search(str(exc)))

    def _again(_attempt: int, _exc: BaseException) -> None:
        log.info("%s: alias %s written concurrently; writing it again", name, alias)

    retry_call(
        lambda: client.set_registered_model_alias(name, alias, str(version)),
        (backoff or alias_race_default()).backoff(attempts=attempts),
        _race,
        clock=clock,
        before_wait=_again,
    )


class ChampionChanged(StepError):
    """A promotion's compare-and-set failed: another promotion moved the champion after the
    challenger was judged; nothing was changed."""


def version_label(version: int | None) -> str:
    return f"v{version}" if version is not None else "none"
