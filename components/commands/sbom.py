"""``python -m components.commands.sbom IMAGE --out FILE``: the CycloneDX SBOM of a local image
(``containers/images.py build``). How it is read from the image: :mod:`components.kube.sbom`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from components.core.artifacts import write_json
from components.kernel.cli import run_cli
from components.kube.sbom import image_sbom, validate

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """``python -m components.commands.sbom IMAGE --out FILE [--python PATH]``."""
    parser = argparse.ArgumentParser(description="The CycloneDX SBOM of a local image.")
    parser.add_argument("image")
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=None, help="the image's interpreter, if any")
    parser.add_argument("--builder", default="podman")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])

    def _go() -> None:
        document = image_sbom(args.builder, args.image, python=args.python)
        validate(document)
        write_json(args.out, document)
        log.info("%s: %d components -> %s", args.image, len(document["components"]), args.out)

    return run_cli(_go)


if __name__ == "__main__":
    raise SystemExit(main())
