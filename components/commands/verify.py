"""``paddle-mlops verify MODEL_URI``: what a registered version's signatures prove, in a few
lines. The checks: :func:`components.kube.verify.check_version`; the tracking store and its
retries: :mod:`components.commands.connection`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from components.commands.connection import add_tracking_flags, open_tracking
from components.kernel.cli import run_cli
from components.kube.verify import check_version
from components.tracking.fetch_model import parse_model_uri, resolve
from components.tracking.signing import TRUST_ENV, VerificationError, trusted_keys


def _format(report: dict[str, Any]) -> str:
    name, version = report["model"], report["version"]
    lines = [f"models:/{name}/{version}: verified against {TRUST_ENV}"]
    prov = report["provenance"]
    deps = prov["dependencies"]
    lines.append(
        f"  provenance  signed by key {prov['signed_by'][:16]} ({prov['key']}); matches the "
        "version's lineage tags: "
        + ", ".join(f"{k} {next(iter(v.values()))[:12]}" for k, v in deps.items())
        + (f"; pipeline run {prov['pipeline_run']}" if prov["pipeline_run"] else "")
    )
    if "bundle" in report:
        lines.append(
            f"  bundle      sha256 {report['bundle']['sha256'][:16]} (every file) signed by key "
            f"{report['bundle']['signed_by'][:16]}"
        )
    image = report.get("image")
    lines.append(
        f"  image       {image['ref']} signed by key {image['signed_by'][:16]}"
        if image
        else "  image       not pushed (no serving_image_digest): nothing to verify"
    )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops verify MODEL_URI``."""
    parser = argparse.ArgumentParser(
        prog="paddle-mlops verify",
        description="Verify a registered version's provenance, bundle and image signatures "
        f"against the keys {TRUST_ENV} names.",
    )
    parser.add_argument("model_uri", help="models:/NAME/VERSION or models:/NAME@ALIAS")
    add_tracking_flags(parser)
    args = parser.parse_args(argv)

    def _go() -> None:
        ref = parse_model_uri(args.model_uri)
        store = open_tracking(args)
        keys = trusted_keys()
        if keys is None:
            raise VerificationError(f"{TRUST_ENV} turns verification off: nothing to verify")
        version = int(resolve(store.client, ref).version)
        report = check_version(store.client, store.uri, ref.name, version, keys)
        sys.stdout.write(_format(report) + f"  tracking    {store}\n")

    return run_cli(_go)


if __name__ == "__main__":
    sys.exit(main())
