"""``report.html``: the interactive report, one self-contained file that works offline.

The page inlines plotly.js (no CDN, no network) and holds: the headline, the setup in one
line, the summary table (sortable by clicking a header; a checkbox shows every column; each
row links the run's files), and the planned charts with their captions (hover values, legend
entries toggle a series). Every number cell carries its exact value in ``data-v`` and shows
it as ``report.md`` does (``tables.fmt``). User text is HTML-escaped.
"""
from __future__ import annotations

import html
from typing import Any

from plotly.offline import get_plotlyjs

from sim.report.context import ReportContext
from sim.report.headline import headline_intro, headlines
from sim.report.html_charts import build
from sim.report.plots import Chart
from sim.report.tables import fmt, interval_note, interval_text, table_layout

#: The run files linked from each table row (those that exist), by stem.
RUN_FILES = ("config.yaml", "summary.json", "requests", "steps")

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1250px;padding:0 1em;
color:#222}
.pi{color:#777;font-size:.85em}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em}
.setup{color:#555}.caption{color:#444;margin:.3em 0 0}
table{border-collapse:collapse;font-size:12.5px}th,td{padding:3px 7px;border-bottom:1px solid
#ddd;white-space:nowrap}th{cursor:pointer;background:#f4f4f4;user-select:none}
td.num{text-align:right;font-variant-numeric:tabular-nums}th.sorted-asc:after{content:" ▲"}
th.sorted-desc:after{content:" ▼"}table.compact .extra{display:none}
.scroll{overflow-x:auto}.chart{margin:1.2em 0 2em}
"""

#: Sorting and the column toggle: a click on a header sorts by its ``data-v`` values
#: (numbers numerically, text alphabetically), a second click reverses.
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var asc = !th.classList.contains("sorted-asc");
      table.querySelectorAll("th").forEach(function (h) {
        h.classList.remove("sorted-asc", "sorted-desc"); });
      th.classList.add(asc ? "sorted-asc" : "sorted-desc");
      rows.sort(function (a, b) {
        var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
        var nx = parseFloat(x), ny = parseFloat(y), c;
        if (!isNaN(nx) && !isNaN(ny)) { c = nx - ny; }
        else if (!isNaN(nx) || !isNaN(ny)) { c = isNaN(nx) ? 1 : -1; }
        else { c = String(x).localeCompare(String(y)); }
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
var toggle = document.getElementById("all-columns");
if (toggle) { toggle.addEventListener("change", function () {
  document.getElementById("summary").classList.toggle("compact", !toggle.checked); }); }
"""


def esc(text: Any) -> str:
    """HTML-escaped text."""
    return html.escape(str(text))


def _cell(col: str, value: Any, extra: bool, band: str = "") -> str:
    """One table cell: the value (``data-v`` exact, for sorting), then its prediction
    interval ``band`` (``tables.interval_text``) in a span of its own."""
    v = value.item() if hasattr(value, "item") else value
    num = isinstance(v, (int, float)) and not isinstance(v, bool)
    data = repr(float(v)) if num else str(v)
    classes = " ".join(c for c, on in (("num", num), ("extra", extra)) if on)
    cls = f' class="{classes}"' if classes else ""
    pi = f'<span class="pi">{esc(band)}</span>' if band else ""
    return f'<td{cls} data-col="{esc(col)}" data-v="{esc(data)}">{esc(fmt(v))}{pi}</td>'


def _files(ctx: ReportContext, rid: str) -> str:
    folder = ctx.runs_dir / rid
    links = []
    for stem in RUN_FILES:
        for path in ([folder / stem] if "." in stem else
                     [folder / f"{stem}.parquet", folder / f"{stem}.csv"]):
            if path.exists():
                links.append(f'<a href="runs/{esc(rid)}/{esc(path.name)}">{esc(path.name)}</a>')
    return (f'<td data-v="{esc(rid)}"><a href="runs/{esc(rid)}/">{esc(rid)}</a> '
            + " ".join(links) + "</td>")


def summary_table(ctx: ReportContext) -> str:
    """The sortable summary table (compact columns shown, the rest behind a checkbox)."""
    lay = table_layout(ctx)
    cols = list(dict.fromkeys([*lay.full, *lay.compact]))
    extra = {c for c in cols if c not in lay.compact}
    hidden = ' class="extra"'
    head = "".join(f'<th{hidden if c in extra else ""} data-col="{esc(c)}">'
                   f"{esc(lay.headers.get(c, c))}</th>" for c in cols)
    body = []
    for _, row in lay.rows.iterrows():
        cells = [_cell(c, row[c], c in extra, interval_text(row, c)) for c in cols]
        body.append(f'<tr data-run="{esc(row["run_id"])}">' + "".join(cells)
                    + _files(ctx, str(row["run_id"])) + "</tr>")
    return ('<label><input type="checkbox" id="all-columns"> all columns</label>'
            '<div class="scroll"><table id="summary" class="sortable compact"><thead><tr>'
            f"{head}<th>run files</th></tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def charts_html(ctx: ReportContext, charts: list[Chart]) -> str:
    """Each chart as a plotly div with its caption (plotly.js itself is inlined once)."""
    parts = []
    for chart in charts:
        fig = build(ctx, chart)
        if fig is None:
            continue
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{chart.name}",
                          config={"displaylogo": False, "responsive": True})
        parts.append(f'<div class="chart"><p class="caption">{esc(chart.caption)}</p>{div}'
                     "</div>")
    return "\n".join(parts)


def render_html(base: dict[str, Any], ctx: ReportContext, charts: list[Chart]) -> str:
    """The text of ``report.html``."""
    name = esc(base.get("name", "experiment"))
    desc = f"<p>{esc(str(base['description']).strip())}</p>" if base.get("description") else ""
    heads = "".join(f"<li>{esc(h.text)}</li>" for h in headlines(ctx))
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in ctx.slos.items()) or "none"
    setup = (f"{esc(ctx.title)} · SLOs: {esc(slo)} · x axis: {esc(ctx.x_key or 'none')} "
             f"({ctx.shape}) · {len(ctx.summary)} finished runs")
    plots = (f"<h2>Charts</h2><p class=setup>Hover for values; click a legend entry to hide "
             f"or show a series, double-click to show it alone.</p>{charts_html(ctx, charts)}"
             if charts else "")
    # plotly.js inlined (about 4.6 MB) only when there are charts: no network needed to view
    plotly = f'<script type="text/javascript">{get_plotlyjs()}</script>' if charts else ""
    note = esc(interval_note(ctx.summary))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{name} · batchsim report</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{STYLE}</style>
{plotly}</head>
<body><h1>{name}</h1>{desc}
<p class="setup">{setup}</p>
<h2>Headline</h2><p>{esc(headline_intro(ctx))}</p><ul id="headline">{heads}</ul>
<h2>Summary</h2><p class="setup">Latencies in ms; fractions in [0, 1]; click a header to
sort. Every metric of every run: <a href="summary.csv">summary.csv</a>. {note}</p>
{summary_table(ctx)}
{plots}
<script>{SCRIPT}</script>
</body></html>
"""

