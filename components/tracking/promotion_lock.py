"""The promotion lock of a registered model: a registered model named
``<model>--promotion-lock`` whose creation is unique in MLflow's backend, held while the
champion changes (:class:`components.tracking.registry.Registry`), tried again under a
:class:`components.core.retry.BackoffParams` (``registry.lock_backoff``) until
``registry.lock_timeout_s``; a lock whose holder is gone is broken.

Library layer: imported by ``components.tracking.registry``.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from components.core.artifacts import StepError
from components.core.retry import SYSTEM_CLOCK, BackoffParams, Clock, poll
from components.tracking.liveness import dead_owner, owner_tags

log = logging.getLogger("components.tracking.registry")  # the registry's logger, as before


def now() -> str:
    """The time of an event, as the registry's history records it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def actor() -> str:
    """Who acts: ``user@host:pid``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


@contextlib.contextmanager
def hold(
    client: Any,
    name: str,
    lock_name: str,
    *,
    timeout_s: float,
    stale_s: float,
    backoff: BackoffParams,
    clock: Clock = SYSTEM_CLOCK,
) -> Iterator[str]:
    """Hold ``lock_name``, the promotion lock of registered model ``name``: creating a
    registered model is unique in the backend DB. Tried again after ``backoff``'s waits, at
    most ``timeout_s`` in all; a lock whose holder is gone (:func:`break_stale`, ``stale_s``
    for another host's) is broken meanwhile. Yields the lock's token."""
    from mlflow.exceptions import MlflowException

    token = uuid.uuid4().hex
    backoff = backoff.backoff(deadline_s=timeout_s)

    def _try() -> bool:
        try:
            client.create_registered_model(
                lock_name,
                tags={
                    "token": token,
                    "owner": actor(),
                    "acquired_at": str(time.time()),
                    **owner_tags(),
                },
                description=f"held while '{name}' changes champion; safe to delete "
                "if no promotion is running",
            )
            return True
        except MlflowException as exc:
            # RESOURCE_DOES_NOT_EXIST: the holder deleted the lock while the server was
            # creating ours (a race seen in test_registry); refused this time, like a lock
            # that exists
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
                raise
        return False

    def _refused(attempt: int) -> None:
        if attempt == 1:  # the first refusal: say what it waits for, once
            log.info(
                "registered model '%s': waiting for '%s', held by another promotion (up to %.0f s)",
                name,
                lock_name,
                timeout_s,
            )
        break_stale(client, name, lock_name, stale_s)

    if not poll(_try, backoff, clock=clock, before_wait=_refused):
        raise StepError(
            f"registered model '{name}': another promotion holds "
            f"'{lock_name}' for over {timeout_s:.0f} s"
        )
    try:
        yield token
    finally:
        with contextlib.suppress(MlflowException):
            held = client.get_registered_model(lock_name).tags.get("token")
            if held == token:
                client.delete_registered_model(lock_name)


def break_stale(client: Any, name: str, lock_name: str, stale_s: float) -> None:
    """Delete ``lock_name`` when its holder is gone (``stale_s``: another host's)."""
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_registered_model(lock_name).tags
    except MlflowException:
        return  # released meanwhile
    acquired = float(tags.get("acquired_at", "0") or 0)
    why = dead_owner(tags, acquired, stale_s)
    if why:
        log.warning(
            "breaking the promotion lock of %s held by %s: %s",
            name,
            tags.get("owner"),
            why,
        )
        with contextlib.suppress(MlflowException):
            if client.get_registered_model(lock_name).tags.get("token") == tags.get("token"):
                client.delete_registered_model(lock_name)
