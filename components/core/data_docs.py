"""Great Expectations Data Docs that read with no network.

GE 1.x writes pages that load Bootstrap, jQuery, bootstrap-table, Font Awesome and Vega from
CDNs, and its index draws the list of validations and suites with bootstrap-table (jQuery) from
a data literal in a ``<script>``: offline, the index lists nothing. :func:`make_offline`
rewrites a built site in place:

- every ``<script>`` goes (GE's inline ones only drive those libraries: tabs, tables, Vega
  charts, which our suites do not draw), and each ``<link href>`` that names another host;
  the navbar's logo, taken from GE's web assets, is the copy GE ships in the site
  (``static/images``);
- each bootstrap-table becomes a static HTML ``<table>`` of the same columns and rows (the
  index's rows keep their links to the validation and suite pages);
- a small stylesheet of our own (:data:`CSS`, ``static/styles/offline.css``) stands in for
  the Bootstrap classes the pages use, and draws Font Awesome's status icons as characters.

Links (``<a href>``) to GE's web site stay: nothing is fetched unless a user follows one.
"""

from __future__ import annotations

import ast
import html
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

CSS_FILE = "static/styles/offline.css"

# stands in for the Bootstrap 4 classes GE's pages use (grid, tables, alerts, cards, navs)
CSS = """\
body { font-family: system-ui, sans-serif; margin: 0; color: #212529; }
a { color: #0b5cad; }
.navbar { display: flex; align-items: center; padding: 0 1rem; border-bottom: 1px solid #ddd; }
.navbar img { height: 50px; }
.container-fluid { padding: 0.5rem 1.5rem; }
.row { display: flex; flex-wrap: wrap; }
.col-12, .col-sm-12, .col-xs-12 { flex: 0 0 100%; max-width: 100%; }
@media (min-width: 768px) {
  .col-md-2 { flex: 0 0 16.6%; max-width: 16.6%; }
  .col-md-10 { flex: 0 0 83.3%; max-width: 83.3%; }
}
.d-none { display: none; }
.alert { padding: 0.5rem 1rem; margin: 0.5rem 0; border-radius: 4px; }
.alert-secondary { background: #e2e3e5; }
.card { border: 1px solid #ddd; border-radius: 4px; margin: 0.5rem 0; }
.card-header { background: #f7f7f7; padding: 0.4rem 0.8rem; border-bottom: 1px solid #ddd; }
.card-body { padding: 0.6rem 0.8rem; }
.nav, .nav-tabs, .breadcrumb { list-style: none; padding-left: 0; display: flex; gap: 1rem; }
table { border-collapse: collapse; margin: 0.5rem 0; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
.table-responsive, .show-scrollbars { overflow-x: auto; }
.text-success { color: #1a7f37; }
.text-danger { color: #c62828; }
.text-warning { color: #b26a00; }
.fas::before { font-style: normal; }
.fa-check-circle::before, .fa-check::before { content: "\\2714"; }
.fa-times-circle::before, .fa-times::before, .fa-circle-xmark::before { content: "\\2718"; }
.fa-exclamation-triangle::before { content: "\\26A0"; }
.fa-question-circle::before { content: "?"; }
.tab-pane::before { display: block; font-weight: bold; font-size: 1.2rem; margin-top: 1rem; }
.tab-pane#Validation-Results::before { content: "Validation Results"; }
.tab-pane#Expectation-Suites::before { content: "Expectation Suites"; }
.btn { display: none; }
"""

_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']https?://[^>]*>\s*</script>\s*", re.I)
_REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref=[\"']https?://[^>]*>\s*", re.I)
_REMOTE_IMG = re.compile(
    r"src=\"https://great-expectations-web-assets\.[^/\"]+/([A-Za-z0-9_.-]+?)(\?[^\"]*)?\""
)
# bootstrap_table.j2: the empty table, its toolbar, GE's helper functions, then the call whose
# arguments hold the columns and rows (Python reprs, one line each)
_TABLE = re.compile(
    r"<table\s+id=\"(?P<id>[^\"]+)\"(?P<attrs>[^>]*)>\s*</table>(?P<rest>.*?)"
    r"\$\('#(?P=id)'\)\.bootstrapTable\(\s*Object\.assign\(\s*\{\s*"
    r"columns: (?P<columns>[^\n]*),\s*\n\s*data: (?P<data>[^\n]*),\s*\n.*?</script>",
    re.S,
)
_TOOLBAR = re.compile(r"<div id=\"[^\"]+-toolbar\"[^>]*>.*?</div>\s*", re.S)
_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>\s*", re.S | re.I)


def _static_table(table_id: str, attrs: str, columns: list[dict], rows: list[dict]) -> str:
    """The rows as a plain table; a row with ``_table_row_link_path`` links its first cell."""
    fields = [c["field"] for c in columns]
    head = "".join(f"<th>{html.escape(str(c.get('title', c['field'])))}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        link = row.get("_table_row_link_path")
        for i, name in enumerate(fields):
            value = str(row.get(name, ""))  # GE's own rendered HTML for the cell
            if name == "validation_success" and row.get("_validation_success_text"):
                value += f" {html.escape(str(row['_validation_success_text']))}"
            if link and i == 0:
                value = f'<a href="{html.escape(str(link))}">{value}</a>'
            cells.append(f"<td>{value}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    attrs = attrs.replace('data-toggle="table"', "").rstrip()
    return (
        f'<table id="{table_id}"{attrs}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _tables(page: str, source: Path) -> str:
    def replace(match: re.Match[str]) -> str:
        try:
            columns = ast.literal_eval(match["columns"])
            rows = ast.literal_eval(match["data"])
        except (ValueError, SyntaxError) as exc:  # GE changed its template: say where
            raise ValueError(
                f"{source}: table {match['id']}: cannot read GE's bootstrap-table data ({exc})"
            ) from exc
        return _static_table(match["id"], match["attrs"], columns, rows)

    return _TABLE.sub(replace, page)


def offline_page(page: str, source: Path, static_prefix: str) -> str:
    """One page with no remote script or stylesheet, static tables, and the local CSS
    (``static_prefix``: the relative way from the page to the site's root, e.g. ``../``)."""
    page = _tables(page, source)
    page = _TOOLBAR.sub("", page)
    page = _REMOTE_SCRIPT.sub("", page)
    page = _REMOTE_LINK.sub("", page)
    page = _SCRIPT.sub("", page)  # GE's inline scripts only drive the removed libraries
    page = _REMOTE_IMG.sub(lambda m: f'src="{static_prefix}static/images/{m[1]}"', page)
    css = f'<link rel="stylesheet" href="{static_prefix}{CSS_FILE}">'
    return page.replace("</head>", f"{css}\n</head>", 1)


def make_offline(site: Path) -> int:
    """Rewrite every page of the Data Docs site ``site`` in place; returns the pages done."""
    (site / CSS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (site / CSS_FILE).write_text(CSS, encoding="utf-8")
    pages = sorted(site.rglob("*.html"))
    for path in pages:
        depth = len(path.relative_to(site).parts) - 1
        text = path.read_text(encoding="utf-8")
        path.write_text(offline_page(text, path, "../" * depth), encoding="utf-8")
    log.debug("Data Docs %s: %d pages made offline", site, len(pages))
    return len(pages)


def remote_references(page: str) -> list[str]:
    """What a page would fetch from another host (``src``/``href`` of scripts, stylesheets,
    images, frames): empty for a page that reads offline."""
    found: list[str] = re.findall(
        r"<(?:script|img|iframe)\b[^>]*\bsrc=[\"'](https?://[^\"']+)", page, re.I
    )
    found += re.findall(r"<link\b[^>]*\bhref=[\"'](https?://[^\"']+)", page, re.I)
    return [u for u in found if not u.startswith(("http://127.0.0.1", "http://localhost"))]
