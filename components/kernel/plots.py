"""``paddle-mlops plots``: one pipeline's ``dvc plots show``, readable with no network.

``dvc plots show`` with no target draws the plots of every ``dvc.yaml`` in the repository (the
other tasks' mixed in), and its page loads Vega, Vega-Lite and Vega-Embed from a CDN: offline,
the charts drawn from CSV are blank. This command passes the pipeline's own plots as the target
(``<its dvc.yaml>::``, a regex DVC matches against ``<dvc.yaml>::<plot id>``) and an HTML
template that carries the three libraries inline (the bundle
``vl-convert-python`` ships, Vega-Lite 5 as DVC's templates are written for), so the page
(``<out>/index.html``, PNGs under ``<out>/static/``) fetches nothing from another host.

The same by hand::

    paddle-mlops plots --template-only build/dvc-plots.html
    dvc plots show dvc.yaml:: --html-template build/dvc-plots.html -o dvc_plots
    dvc plots show tasks/sentiment/dvc.yaml:: --html-template build/dvc-plots.html \\
        -o dvc_plots/sentiment
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from components.core.artifacts import StepError, atomic_path
from components.kernel.cli import run_cli
from components.kernel.dvc import DEFAULT_PARAMS, REPO, dvc_yaml_path, pipeline_name

log = logging.getLogger(__name__)

VEGA_LITE = "5.21"  # DVC's plot templates are Vega-Lite 5 specs

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<title>DVC plots</title>
<script type="text/javascript">
{bundle}
</script>
<style>
  body {{ font-family: system-ui, sans-serif; margin: 1rem; }}
  table {{ border-spacing: 15px; }}
  img {{ max-width: 100%; }}
</style>
</head>
<body>
<h1>{title}</h1>
{{plot_divs}}
</body>
</html>
"""


def template(title: str) -> str:
    """The HTML template for ``dvc plots show --html-template``: Vega inline, no
    ``{scripts}`` placeholder (so DVC's CDN script tags are never added)."""
    try:
        import vl_convert
    except ImportError as exc:
        raise StepError(
            "paddle-mlops plots needs vl-convert-python (a dev dependency): make install"
        ) from exc

    bundle = vl_convert.javascript_bundle(vl_version=VEGA_LITE)
    # DVC fills the template with str.replace of "{plot_divs}": the bundle is left as it is
    return PAGE.format(bundle="{bundle}", title=title).replace("{bundle}", bundle)


def write_template(dest: Path, title: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(template(title), encoding="utf-8")
    return dest


def show(params_file: str, out: Path) -> Path:
    """``dvc plots show`` of the pipeline of ``params_file`` into ``out``; returns the page."""
    pipeline = dvc_yaml_path(params_file)
    if not pipeline.is_file():
        raise StepError(f"--params {params_file}: no pipeline at {pipeline}")
    dvc = shutil.which("dvc") or str(Path(sys.executable).parent / "dvc")
    # DVC matches a target as a regex (re.match) against "<dvc.yaml>::<plot id>": this file's
    # plots only (a bare path would also be drawn as a data file of its own). Not escaped:
    # DVC turns a backslash into a path separator; a "." matching any character is harmless
    target = pipeline.relative_to(REPO).as_posix() + "::"
    out = out.resolve()
    title = f"{pipeline.relative_to(REPO)} plots"
    page_template = write_template(out.parent / f".{out.name}.template.html", title)
    try:
        cmd = [dvc, "plots", "show", target, "--html-template", str(page_template)]
        proc = subprocess.run([*cmd, "-o", str(out)], cwd=REPO, capture_output=True, text=True)
    finally:
        page_template.unlink(missing_ok=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise StepError(f"dvc plots show {target}: exit {proc.returncode}: {last}")
    return out / "index.html"


def main(argv: Sequence[str] | None = None) -> int:
    """``paddle-mlops plots [--params P] [--out DIR]``: the plots of one pipeline."""
    parser = argparse.ArgumentParser(prog="paddle-mlops plots", description=__doc__.split("\n")[0])
    parser.add_argument("--params", default=DEFAULT_PARAMS, help="the pipeline's params file")
    parser.add_argument(
        "--out", help="output directory (default dvc_plots, another pipeline's dvc_plots/<name>)"
    )
    parser.add_argument(
        "--template-only",
        metavar="FILE",
        help="only write the offline HTML template for `dvc plots show --html-template`",
    )
    args = parser.parse_args(argv)

    def _go() -> None:
        if args.template_only:
            log.info("wrote %s", write_template(Path(args.template_only), "DVC plots"))
            return
        name = pipeline_name(args.params)
        default = REPO / "dvc_plots" / name if name else REPO / "dvc_plots"
        page = show(args.params, Path(args.out) if args.out else default)
        log.info("plots of %s: %s", args.params, page)

    return run_cli(_go)
