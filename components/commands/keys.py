"""``paddle-mlops keys generate DIR [--name NAME]``: a signing key pair (docs/provenance.md).

The keys themselves, signing and verifying: :mod:`components.tracking.signing`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from components.kernel.cli import run_cli
from components.tracking.signing import generate


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops keys generate DIR [--name NAME]``."""
    parser = argparse.ArgumentParser(
        prog="paddle-mlops keys",
        description="Signing keys (docs/provenance.md): generate an ECDSA P-256 key pair.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write DIR/NAME.key (0600) and DIR/NAME.pub")
    gen.add_argument("directory")
    gen.add_argument("--name", default="signing")
    args = parser.parse_args(argv)

    def _go() -> None:
        private, public = generate(args.directory, args.name)
        sys.stdout.write(f"private key {private} (keep it in a Secret)\npublic key {public}\n")

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
