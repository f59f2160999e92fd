"""The HTML pages: small shells that load the vendored chart library and ``vigil.js``, which draws them.

Anything taken from the request (a run id) is HTML-escaped here; the script puts data on the
page as text (``textContent``), never as markup.
"""

from __future__ import annotations

from html import escape

from starlette.requests import Request
from starlette.responses import HTMLResponse

from trainvigil._version import __version__

_X_AXIS = """<label>x axis <select id="xaxis"><option value="step">step</option>
<option value="time">wall time</option></select></label>"""
"""The step / wall-time toggle of the Run and Compare pages (``vigil.js`` reads ``?x=time``)."""
_EVENT_LANE = """<div id="event-lane" class="lane" hidden><span class="muted">events</span>
<span class="lo muted"></span><div class="track"></div><span class="hi muted"></span><div class="tip"></div></div>"""
"""The Run page's events, a tick each along the run's steps, above the charts (``vigil.js`` draws them)."""
_EVENTS_PAGER = """<div id="events-pager" class="pager" hidden><button id="events-newest">&laquo; newest</button>
<button id="events-newer">&lsaquo; newer</button><span class="muted"></span>
<button id="events-older">older &rsaquo;</button>
<button id="events-oldest">oldest &raquo;</button></div>"""
"""The Run page's events table goes a page at a time, newest first: a long run logs thousands."""
_FEEDS = """<h2>Detector inputs</h2><p class="muted">Which detector each logged name feeds (a silent detector
may have no input). Map your own names with <span class="mono">names={"my/loss": "loss"}</span> in
<span class="mono">wandb.init</span> or <span class="mono">SummaryWriter</span>.</p>
<table id="feeds" class="grid"><thead><tr><th>logged name</th><th>detector input</th><th>read by</th></tr></thead>
<tbody></tbody></table><p id="unfed" class="muted"></p>"""
"""The Run page's "logged name → detector input" table (:mod:`.inputs`), filled by ``vigil.js``."""
_NAV = (("runs", "/", "Runs"), ("compare", "/compare", "Compare"), ("alerts", "/alerts", "Alerts"))


def render(page: str, title: str, body: str = "") -> str:
    """A whole page; ``title`` is escaped, ``body`` is trusted markup written in this module."""
    nav = "".join(f'<a href="{href}"{" class=current" if key == page else ""}>{label}</a>' for key, href, label in _NAV)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · trainvigil</title><link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/uPlot.min.css"><link rel="stylesheet" href="/static/vigil.css">
</head><body data-page="{page}">
<header><span class="brand">trainvigil</span><nav>{nav}</nav>
<span id="live" class="live" title="live updates from the daemon">○ offline</span>
<span class="version">v{escape(__version__)}</span></header>
<main>{body}</main>
<script src="/static/uPlot.iife.min.js"></script><script src="/static/vigil.js"></script>
</body></html>"""


async def runs_page(request: Request) -> HTMLResponse:
    body = """<h1>Runs</h1>
<div class="controls"><input id="filter" type="search" placeholder="filter by run id or status">
<span id="count" class="muted"></span></div>
<table id="runs" class="grid"><thead><tr><th>run</th><th>status</th><th>ranks</th><th>last step</th>
<th>steps/s</th><th>last seen</th><th>open alerts</th></tr></thead><tbody></tbody></table>"""
    return HTMLResponse(render("runs", "Runs", body))


async def run_page(request: Request) -> HTMLResponse:
    run_id = request.query_params.get("id", "")
    body = f"""<h1>Run <span id="run-id" class="mono">{escape(run_id)}</span>
<span id="status" class="badge"></span></h1>
<div class="controls"><span id="ranks"></span>
<label><input type="checkbox" id="log"> log scale</label>
<label>smoothing <input type="range" id="smooth" min="0" max="0.99" step="0.01" value="0"></label>
<span id="smooth-value" class="muted">0</span>
{_X_AXIS}<button id="reset">reset zoom</button><span class="muted">drag on a chart to zoom</span></div>
<div class="controls"><input id="metric-filter" type="search" placeholder="filter metrics by name">
<span id="metric-count" class="muted"></span></div>
{_EVENT_LANE}<div id="charts" class="charts"></div>
{_FEEDS}
<h2>Alerts</h2><table id="anomalies" class="grid"><thead><tr><th>time</th><th>rank</th><th>step</th>
<th>detector</th><th>severity</th><th>state</th><th>message</th></tr></thead><tbody></tbody></table>
<h2>Events</h2>{_EVENTS_PAGER}<table id="events" class="grid"><thead><tr><th>step</th><th>rank</th><th>kind</th>
<th>detail</th></tr></thead><tbody></tbody></table>"""
    return HTMLResponse(render("run", run_id or "Run", body))


async def compare_page(request: Request) -> HTMLResponse:
    body = f"""<h1>Compare</h1>
<div class="controls"><label>metric <select id="metric"></select></label>
<label><input type="checkbox" id="log"> log scale</label>{_X_AXIS}<button id="reset">reset zoom</button>
<span class="muted">pick up to 10 runs</span></div>
<div id="picker" class="picker"></div><div class="controls"><span id="ranks"></span></div>
<div id="charts" class="charts"></div>"""
    return HTMLResponse(render("compare", "Compare", body))


async def alerts_page(request: Request) -> HTMLResponse:
    body = """<h1>Alerts</h1><table id="anomalies" class="grid"><thead><tr><th>time</th><th>run</th><th>rank</th>
<th>step</th><th>detector</th><th>severity</th><th>state</th><th>message</th></tr></thead><tbody></tbody></table>"""
    return HTMLResponse(render("alerts", "Alerts", body))
