"""``paddle-mlops fetch-model MODEL_URI DEST``: a registered version's verified bundle into DEST
(an init container, a KServe storage initializer: ``k8s/serving/``, ``k8s/kserve/``).

What is fetched and checked: :mod:`components.tracking.fetch_model`; the tracking store and
its retries: :mod:`components.commands.connection`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from components.commands.connection import add_tracking_flags, open_tracking
from components.kernel.cli import run_cli
from components.tracking.fetch_model import fetch


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops fetch-model MODEL_URI DEST``."""
    parser = argparse.ArgumentParser(
        prog="paddle-mlops fetch-model",
        description="Download a registered version's serving bundle into DEST and verify its "
        "sha256 against the registration (an init container / KServe storage initializer).",
    )
    parser.add_argument("model_uri", help="models:/NAME/VERSION or models:/NAME@ALIAS")
    parser.add_argument("dest", help="model directory (absent, or empty)")
    add_tracking_flags(parser)
    args = parser.parse_args(argv)

    def _go() -> None:
        store = open_tracking(args)
        got = fetch(args.model_uri, args.dest, tracking=store.uri, client=store.client)
        signed = f" signed by key {got.signed_by}" if got.signed_by else " (origin not verified)"
        sys.stdout.write(
            f"{got.name} v{got.version} sha256 {got.sha256}{signed} -> {got.dest} "
            f"(tracking URI {store})\n"
        )

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
