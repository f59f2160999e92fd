"""The web view in a real headless browser (Debian's chromium driven by Playwright) against a real
daemon fed by real agents: runs, charts, alert episodes on the charts, live updates, escaping,
downsampling, and ``/metrics`` checked by ``promtool``.

Screenshots go to ``$VIGIL_TEST_ARTIFACTS/web`` (default ``build/test-artifacts/web``).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from support import Daemon, NatsServer, wait_for

import trainvigil

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("VIGIL_TEST_ARTIFACTS", ROOT / "build" / "test-artifacts")) / "web"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RUN, XSS, LONG, MANY = "web-run", "<script>alert(1)</script>", "long-run", "many-metrics"
# A run whose loss goes NaN at step 50 of 200 while its lr runs on; a run with an eval at every step and its
# twin without events (the same metrics and steps, so their pages differ by the events alone).
NAN_RUN, EVALS, QUIET = "nan-run", "evals-run", "quiet-run"
SHORT_STEPS, LOSS_NAN_AT, EVENTS_PAGE = 200, 50, 20
STEPS, NAN_STEP, LONG_STEPS, SPIKE_STEP = 300, 200, 6000, 4321
MANY_METRICS, MANY_STEPS = 300, 10
MAX_CHARTS = 60  # vigil.js draws at most this many charts on a run page
LONG_STEP_S = 50e-6
VIGIL = [sys.executable, "-m", "trainvigil.daemon.cli"]


class Site:
    """The daemon under test, its broker, and the agents that feed it (still open: tests log more)."""

    def __init__(self, nats: NatsServer, daemon: Daemon, agents: list[trainvigil.Agent]) -> None:
        self.nats, self.daemon, self.agents = nats, daemon, agents
        self.base = f"http://127.0.0.1:{daemon.http_port}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base + path, trust_env=False, timeout=10)


def _many(i: int) -> str:
    return f"m{i:03d}"


def _loss(step: int, rank: int) -> float:
    return 2.0 * math.exp(-step / 100) + 0.05 * math.sin(step / 7 + rank)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("web")
    os.environ.setdefault("VIGIL_SPILL_DIR", str(root / "spill"))
    nats = NatsServer(root / "jetstream")
    nats.start()
    daemon = Daemon(nats.url, root / "data")
    agents: list[trainvigil.Agent] = []
    try:
        daemon.start()
        ranks = [trainvigil.init(RUN, rank, nats.url, flush_interval=0.05) for rank in (0, 1)]
        xss = trainvigil.init(XSS, 0, nats.url, flush_interval=0.05)
        long = trainvigil.init(LONG, 0, nats.url, flush_interval=0.05)
        many = trainvigil.init(MANY, 0, nats.url, flush_interval=0.05)
        nan_run, evals, quiet = (trainvigil.init(r, 0, nats.url, flush_interval=0.05) for r in (NAN_RUN, EVALS, QUIET))
        agents = [*ranks, xss, long, many, nan_run, evals, quiet]
        for step in range(SHORT_STEPS):
            nan_run.log(step, loss=float("nan") if step >= LOSS_NAN_AT else _loss(step, 0), lr=1e-3)
            for agent in (evals, quiet):
                agent.log(step, loss=_loss(step, 0), lr=1e-3)
            evals.event("eval", step=step, accuracy=step / SHORT_STEPS)
        for step in range(MANY_STEPS):
            many.log(step, **{_many(i): i + step / 10 for i in range(MANY_METRICS)})
        for step in range(STEPS):
            for rank, agent in enumerate(ranks):
                grad = float("nan") if (rank, step) == (0, NAN_STEP) else 1.0 + 0.1 * math.sin(step / 9)
                agent.log(step, loss=_loss(step, rank), grad_norm=grad, lr=1e-3, step_time=0.05, my_metric=step % 40)
            xss.log(step, loss=1.0 / (step + 1))
        ranks[0].event("eval", step=150, accuracy=0.9)
        # Paced, 6 000 steps over ~0.3 s: dragging across the time axis assumes steps spread evenly in time. Logged back
        # to back they took a few ms, and one GIL hand-over to the agent's thread (up to 5 ms) left most of the
        # axis empty: a drag over its middle third then asked for steps 0-3096 (a run on a loaded machine).
        start = time.perf_counter()
        for step in range(LONG_STEPS):
            while time.perf_counter() < start + step * LONG_STEP_S:
                pass
            long.log(step, loss=100.0 if step == SPIKE_STEP else 1.0 + (step % 2) * 0.01)
        assert all(agent.flush(30) for agent in agents)
        total = 2 * STEPS + STEPS + LONG_STEPS + MANY_STEPS + 3 * SHORT_STEPS
        wait_for(lambda: daemon.scalar("select count(*) from steps") == total, 30, "every step committed")
        for run in (RUN, NAN_RUN):
            wait_for(
                functools.partial(
                    daemon.scalar, f"select count(*) from anomalies where run_id = '{run}' and detector = 'non_finite'"
                ),
                30,
                f"the non_finite alert of {run}",
            )
        wait_for(
            lambda: (
                daemon.scalar(f"select count(*) from events where run_id = '{EVALS}' and kind = 'eval'") == SHORT_STEPS
            ),
            30,
            "every eval event",
        )
        yield Site(nats, daemon, agents)
    finally:
        for agent in agents:
            agent.close(5)
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.kill()
        nats.stop()


# ---- the data endpoints (no browser) -------------------------------------------------------------


def test_a_long_run_opens_downsampled_with_its_spike_and_zooming_in_fetches_every_step(site: Site) -> None:
    whole = site.get(f"/api/series?id={LONG}&metric=loss").json()
    series = whole["series"]["0"]
    assert len(series["x"]) <= 2000, "at most ~2 000 points per series"
    assert 100.0 in series["y"] and SPIKE_STEP in series["x"], "min/max buckets keep the spike"
    zoom = site.get(f"/api/series?id={LONG}&metric=loss&lo=1000&hi=1100").json()["series"]["0"]
    assert zoom["x"] == list(range(1000, 1101)), "zoomed in: every step of the range"


def test_data_requests_cannot_change_the_history(site: Site) -> None:
    before = site.daemon.scalar("select count(*) from steps")
    evil = quote("x'] IS NULL); DELETE FROM steps; --")
    for path in (f"/api/series?id={RUN}&metric={evil}", f"/api/series?id={evil}&metric=loss", f"/api/run?id={evil}"):
        assert site.get(path).status_code in (200, 400, 404), path
    assert site.daemon.scalar("select count(*) from steps") == before
    for bad in ("lo=x", "hi=inf", "lo=nan"):
        assert site.get(f"/api/series?id={RUN}&metric=loss&{bad}").status_code == 400, bad


def test_metrics_pass_promtool_check(site: Site) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; .ci/run does)")
    text = site.get("/metrics").text
    assert 'vigil_events_ingested_total{kind="steps"}' in text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


# ---- the pages in a real browser -------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    tab = context.new_page()
    tab.dialogs = []  # an alert() would mean a script got through
    tab.errors = []
    tab.blocked = []  # what the Content-Security-Policy refused: the pages must need nothing it forbids
    tab.on("dialog", lambda d: (tab.dialogs.append(d.message), d.dismiss()))
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    tab.on("console", lambda m: "Content Security Policy" in m.text and tab.blocked.append(m.text))
    yield tab
    context.close()
    assert not tab.errors, tab.errors
    assert not tab.blocked, tab.blocked


def _open(page: object, site: Site, path: str) -> None:
    page.goto(site.base + path)  # type: ignore[attr-defined]
    page.wait_for_function("() => document.body.dataset.ready === '1'", timeout=10_000)  # type: ignore[attr-defined]


def _shot(page: object, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)  # type: ignore[attr-defined]


def test_the_runs_page_lists_every_run_and_renders_a_script_run_id_as_text(site: Site, page: object) -> None:
    _open(page, site, "/")
    links = page.locator("#runs tbody a")  # type: ignore[attr-defined]
    assert sorted(links.all_text_contents()) == sorted([RUN, XSS, LONG, MANY, NAN_RUN, EVALS, QUIET])
    assert page.locator("#runs script").count() == 0  # type: ignore[attr-defined]
    _shot(page, "runs.png")
    assert page.dialogs == []  # type: ignore[attr-defined]


def test_the_run_page_draws_a_chart_per_metric_with_the_alert_episode_on_grad_norm(site: Site, page: object) -> None:
    _open(page, site, "/run?id=" + quote(RUN))
    charts = page.locator(".chart")  # type: ignore[attr-defined]
    assert sorted(charts.evaluate_all("cs => cs.map(c => c.dataset.metric)")) == sorted(
        ["loss", "grad_norm", "lr", "step_time", "my_metric"]
    )
    assert page.locator(".chart canvas").count() >= 5  # type: ignore[attr-defined]
    band = page.locator("#chart-grad_norm .episode.sev-page")  # type: ignore[attr-defined]
    assert band.count() == 1
    assert "grad_norm is nan" in (band.get_attribute("title") or "")
    assert page.locator("#anomalies tbody tr").count() >= 1  # type: ignore[attr-defined]
    assert page.locator('#event-lane .tick[data-kind="eval"]').count() == 1  # type: ignore[attr-defined]
    over = page.locator("#chart-grad_norm .u-over")  # type: ignore[attr-defined]
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * NAN_STEP / (STEPS - 1), box["y"] + box["height"] / 2)  # type: ignore[attr-defined]
    tip = page.locator("#chart-grad_norm .tip")  # type: ignore[attr-defined]
    assert tip.is_visible() and "grad_norm is nan" in tip.inner_text(), "hovering the band shows the alert"
    legend_step = page.locator("#chart-grad_norm .u-legend .u-series").first.inner_text()  # type: ignore[attr-defined]
    assert "·" in legend_step, f"the hovered step's wall time is shown: {legend_step!r}"
    _shot(page, "run-with-alert.png")


def _x_scales(page: object) -> dict[str, tuple[float, float]]:
    """Each chart's drawn x range, read from its uPlot instance."""
    spans = page.locator(".chart").evaluate_all(  # type: ignore[attr-defined]
        "cs => cs.map(c => [c.dataset.metric, c.chart.plot.scales.x.min, c.chart.plot.scales.x.max])"
    )
    return {metric: (lo, hi) for metric, lo, hi in spans}


def test_a_metric_gone_nan_is_marked_on_its_chart_and_every_chart_spans_the_run_with_the_alert(
    site: Site, page: object
) -> None:
    answer = site.get(f"/api/run/series?id={NAN_RUN}&metric=loss&metric=lr").json()["metrics"]
    nonfinite = answer["loss"]["0"]["nonfinite"]
    assert (nonfinite["x"][0], nonfinite["v"][0]) == (LOSS_NAN_AT, "nan"), "the API carries the NaN explicitly"
    assert "nonfinite" not in answer["lr"]["0"]
    _open(page, site, "/run?id=" + NAN_RUN)
    scales = _x_scales(page)
    assert set(scales) == {"loss", "lr"}
    assert all(span == (0, SHORT_STEPS - 1) for span in scales.values()), f"one x range for the run: {scales}"
    marker = page.locator(f'#chart-loss .nonfinite[data-step="{LOSS_NAN_AT}"]')  # type: ignore[attr-defined]
    assert marker.count() == 1 and marker.get_attribute("data-kind") == "nan"
    assert f"NaN at step {LOSS_NAN_AT}" in (marker.get_attribute("title") or "")
    assert page.locator("#chart-lr .nonfinite").count() == 0  # type: ignore[attr-defined]
    for metric in scales:
        band = page.locator(f"#chart-{metric} .episode.sev-page")  # type: ignore[attr-defined]
        assert band.count() == 1, f"the non_finite alert band on the {metric} chart"
        assert "non_finite" in (band.get_attribute("title") or "")
    assert f"NaN at step {LOSS_NAN_AT}" in page.locator("#chart-loss .note").inner_text()  # type: ignore[attr-defined]
    box = page.locator("#chart-loss .u-over").bounding_box()  # type: ignore[attr-defined]
    page.mouse.move(box["x"] + box["width"] * LOSS_NAN_AT / (SHORT_STEPS - 1), box["y"] + 4)  # type: ignore[attr-defined]
    tip = page.locator("#chart-loss .tip")  # type: ignore[attr-defined]
    assert tip.is_visible() and f"NaN at step {LOSS_NAN_AT}" in tip.inner_text(), "hovering the marker names it"
    _shot(page, "run-non-finite.png")


def test_zooming_one_chart_of_a_run_zooms_every_chart_and_reset_restores_the_run(site: Site, page: object) -> None:
    _open(page, site, "/run?id=" + NAN_RUN)
    box = page.locator("#chart-lr .u-over").bounding_box()  # type: ignore[attr-defined]
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.1, y)  # type: ignore[attr-defined]
    page.mouse.down()  # type: ignore[attr-defined]
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)  # type: ignore[attr-defined]
    page.mouse.up()  # type: ignore[attr-defined]
    page.wait_for_function("() => document.querySelector('#chart-loss .note').textContent.includes('steps ')")  # type: ignore[attr-defined]
    scales = _x_scales(page)
    assert scales["loss"] == scales["lr"] and scales["lr"][1] < SHORT_STEPS / 2 + 5, scales
    page.click("#reset")  # type: ignore[attr-defined]
    page.wait_for_function("() => !document.querySelector('#chart-loss .note').textContent.includes('steps ')")  # type: ignore[attr-defined]
    assert all(span == (0, SHORT_STEPS - 1) for span in _x_scales(page).values())


def test_a_run_with_200_evals_draws_them_in_one_lane_and_pages_its_events_table(site: Site, page: object) -> None:
    height = "() => document.documentElement.scrollHeight"
    _open(page, site, "/run?id=" + QUIET)
    quiet = page.evaluate(height)  # type: ignore[attr-defined]
    _open(page, site, "/run?id=" + EVALS)
    assert page.evaluate(height) < 2 * quiet, "the events do not stretch the page"  # type: ignore[attr-defined]
    assert page.locator(".chart .event").count() == 0, "no event lines on the charts"  # type: ignore[attr-defined]
    assert page.locator('#event-lane .tick[data-kind="eval"]').count() == SHORT_STEPS  # type: ignore[attr-defined]
    lane = page.locator("#event-lane").bounding_box()  # type: ignore[attr-defined]
    page.mouse.move(lane["x"] + lane["width"] / 2, lane["y"] + lane["height"] / 2)  # type: ignore[attr-defined]
    tip = page.locator("#event-lane .tip")  # type: ignore[attr-defined]
    assert tip.is_visible() and "eval @ step" in tip.inner_text(), "hovering the lane names the events there"
    steps = page.locator("#events tbody tr td:first-child")  # type: ignore[attr-defined]
    assert steps.count() == EVENTS_PAGE
    assert int(steps.first.inner_text()) == SHORT_STEPS - 1, "newest first"
    pages = 1
    while page.locator("#events-older").is_enabled() and pages < 50:  # type: ignore[attr-defined]
        page.click("#events-older")  # type: ignore[attr-defined]
        pages += 1
    assert pages == SHORT_STEPS // EVENTS_PAGE
    assert steps.count() == EVENTS_PAGE and int(steps.last.inner_text()) == 0, "the last page ends at the first event"
    assert f"page {pages} of {pages}" in page.locator("#events-pager").inner_text()  # type: ignore[attr-defined]
    _shot(page, "run-many-events.png")


@pytest.mark.serial  # a 2 s latency bound through a browser
def test_a_step_logged_while_the_run_page_is_open_appears_within_2_s(site: Site, page: object) -> None:
    _open(page, site, "/run?id=" + quote(RUN))
    page.wait_for_function("() => document.querySelector('#live').classList.contains('on')", timeout=5000)  # type: ignore[attr-defined]
    new = STEPS + 50
    site.agents[0].log(new, loss=0.01, grad_norm=1.0)
    assert site.agents[0].flush(10)
    logged = time.monotonic()
    page.wait_for_function(  # type: ignore[attr-defined]
        f"() => +document.querySelector('#chart-loss').dataset.lastStep >= {new}", timeout=5000
    )
    assert time.monotonic() - logged < 2.0, "a live page shows a new step within 2 s"


def test_a_live_update_refetches_the_charts_on_screen_and_one_out_of_view_once_scrolled_to(
    site: Site, page: object
) -> None:
    page.set_viewport_size({"width": 1400, "height": 450})  # type: ignore[attr-defined]  # one row of charts
    _open(page, site, "/run?id=" + quote(RUN))
    page.wait_for_function("() => document.querySelector('#live').classList.contains('on')", timeout=5000)  # type: ignore[attr-defined]
    below = page.locator("#chart-my_metric")  # type: ignore[attr-defined]
    before = int(below.get_attribute("data-last-step") or 0)
    new = STEPS + 100
    site.agents[1].log(new, loss=0.01, my_metric=1.0)
    assert site.agents[1].flush(10)
    page.wait_for_function(f"() => +document.querySelector('#chart-loss').dataset.lastStep >= {new}", timeout=5000)  # type: ignore[attr-defined]
    assert int(below.get_attribute("data-last-step") or 0) == before, "a chart out of view is not refetched"
    below.scroll_into_view_if_needed()
    page.wait_for_function(f"() => +document.querySelector('#chart-my_metric').dataset.lastStep >= {new}", timeout=5000)  # type: ignore[attr-defined]


def test_the_run_page_of_a_script_run_id_shows_it_as_text(site: Site, page: object) -> None:
    _open(page, site, "/run?id=" + quote(XSS))
    assert page.locator("#run-id").text_content() == XSS  # type: ignore[attr-defined]
    assert page.title().startswith(XSS)  # type: ignore[attr-defined]
    assert page.locator(".chart[data-metric=loss] canvas").count() >= 1  # type: ignore[attr-defined]
    assert page.dialogs == []  # type: ignore[attr-defined]


def _legend(page: object) -> list[str]:
    return page.locator(".u-legend .u-label").all_text_contents()[1:]  # type: ignore[attr-defined]  # [0]: x


def test_the_run_page_draws_wall_time_on_the_x_axis_with_units_marks_and_zoom(site: Site, page: object) -> None:
    _open(page, site, "/run?id=" + quote(RUN) + "&x=time")
    loss = page.locator("#chart-loss")  # type: ignore[attr-defined]
    assert loss.get_attribute("data-xmode") == "time"
    ticks = (loss.get_attribute("data-xticks") or "").split("|")
    assert any(ticks) and all(t == "" or t.endswith((" ms", " s", " min", " h", " d")) for t in ticks), ticks
    assert page.locator("#chart-grad_norm .episode.sev-page").count() == 1, "the alert band is placed in time"  # type: ignore[attr-defined]
    box = page.locator("#chart-loss .u-over").bounding_box()  # type: ignore[attr-defined]
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # type: ignore[attr-defined]
    legend_x = page.locator("#chart-loss .u-legend .u-series").first.inner_text()  # type: ignore[attr-defined]
    assert "+" in legend_x and "step" in legend_x, f"the hovered time and its step: {legend_x!r}"
    _shot(page, "run-wall-time.png")
    page.select_option("#xaxis", "step")  # type: ignore[attr-defined]
    page.wait_for_function("() => document.querySelector('#chart-loss').dataset.xmode === 'step'")  # type: ignore[attr-defined]
    assert "x=time" not in page.url  # type: ignore[attr-defined]


@pytest.mark.parametrize("xmode", ["step", "time"])
def test_dragging_a_range_on_either_x_axis_fetches_the_steps_inside_it(site: Site, page: object, xmode: str) -> None:
    _open(page, site, f"/run?id={LONG}&x={xmode}")
    loss = page.locator("#chart-loss")  # type: ignore[attr-defined]
    box = loss.locator(".u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)  # type: ignore[attr-defined]
    page.mouse.down()  # type: ignore[attr-defined]
    page.mouse.move(box["x"] + box["width"] * 0.7, y, steps=5)  # type: ignore[attr-defined]
    page.mouse.up()  # type: ignore[attr-defined]
    page.wait_for_function("() => document.querySelector('#chart-loss .note').textContent.includes('steps')")  # type: ignore[attr-defined]
    lo, hi = (
        int(v) for v in loss.locator(".note").inner_text().rpartition("steps ")[2].split("\u2013")
    )  # the note writes an en dash
    assert 0 < lo < hi < LONG_STEPS - 1, (lo, hi)
    page.wait_for_function(f"() => +document.querySelector('#chart-loss').dataset.lastStep <= {hi}")  # type: ignore[attr-defined]
    assert loss.get_attribute("data-xmode") == xmode, "zoomed in, on the same axis"


def test_compare_overlays_every_rank_of_each_run_named_in_the_legend(site: Site, page: object) -> None:
    _open(page, site, f"/compare?metric=loss&id={quote(RUN)}&id={quote(XSS)}&ranks=all")
    assert _legend(page) == [f"{RUN} · rank 0", f"{RUN} · rank 1", f"{XSS} · rank 0"]
    _shot(page, "compare-ranks.png")
    page.locator("#ranks input[data-rank='all']").uncheck()  # type: ignore[attr-defined]
    page.locator("#ranks input[data-rank='0']").uncheck()  # type: ignore[attr-defined]
    page.locator("#ranks input[data-rank='1']").check()  # type: ignore[attr-defined]
    page.wait_for_function("() => document.querySelectorAll('.u-legend .u-label').length === 2")  # type: ignore[attr-defined]
    assert _legend(page) == [f"{RUN} · rank 1"], "a rank a run lacks draws nothing for it"
    assert "ranks=1" in page.url  # type: ignore[attr-defined]
    page.select_option("#xaxis", "time")  # type: ignore[attr-defined]
    page.wait_for_function("() => document.querySelector('.chart').dataset.xmode === 'time'")  # type: ignore[attr-defined]


def test_the_compare_answer_names_run_and_rank_of_each_series(site: Site) -> None:
    body = site.get(f"/api/compare?metric=loss&id={quote(RUN)}&id={quote(XSS)}&ranks=0,1").json()
    named = sorted((s["run"], s["rank"]) for s in body["series"].values())
    assert named == [(XSS, 0), (RUN, 0), (RUN, 1)]
    assert sorted(site.get(f"/api/compare?metric=loss&id={quote(RUN)}").json()["series"]) == [f"0:{RUN}"]


def test_compare_and_alerts_pages_draw(site: Site, page: object) -> None:
    _open(page, site, f"/compare?metric=loss&id={quote(RUN)}&id={quote(XSS)}")
    assert _legend(page) == [f"{RUN} · rank 0", f"{XSS} · rank 0"], "rank 0 of each run by default"
    _open(page, site, "/alerts")
    assert "non_finite" in page.locator("#anomalies tbody").inner_text()  # type: ignore[attr-defined]
    assert page.dialogs == []  # type: ignore[attr-defined]


def _web_queries(site: Site) -> int:
    """The queries the web view ran so far (``vigil_web_queries_total``, every endpoint)."""
    lines = site.get("/metrics").text.splitlines()
    return int(sum(float(line.rpartition(" ")[2]) for line in lines if line.startswith("vigil_web_queries_total{")))


def test_a_run_page_of_300_metrics_asks_a_few_batched_queries_and_draws_at_most_its_cap(
    site: Site, page: object
) -> None:
    before = _web_queries(site)
    _open(page, site, "/run?id=" + MANY)
    charts = page.locator(".chart")  # type: ignore[attr-defined]
    assert charts.count() == MAX_CHARTS
    assert page.locator(".chart canvas").count() >= 2  # type: ignore[attr-defined]  # the ones on screen
    count = page.locator("#metric-count").inner_text()  # type: ignore[attr-defined]
    assert f"{MAX_CHARTS} of {MANY_METRICS} metrics" in count, count
    # The run's row, its alerts, events and alert list, and the charts on screen in one or two batches.
    asked = _web_queries(site) - before
    assert asked <= 6, f"one page view ran {asked} queries"
    page.fill("#metric-filter", "m29")  # type: ignore[attr-defined]
    page.wait_for_function("() => document.querySelectorAll('.chart').length === 10")  # type: ignore[attr-defined]
    assert charts.evaluate_all("cs => cs.map(c => c.dataset.metric)") == [_many(i) for i in range(290, 300)]
    page.wait_for_function("() => +document.querySelector('#chart-m290').dataset.lastStep === 9")  # type: ignore[attr-defined]
    assert page.locator("#metric-count").inner_text() == ""  # type: ignore[attr-defined]


# ---- vigil plot -------------------------------------------------------------------------------------


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "a PNG file"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_vigil_plot_draws_one_panel_per_requested_metric(site: Site, tmp_path: Path) -> None:
    sizes = {}
    for metrics in ("loss,grad_norm", "loss,grad_norm,lr,my_metric"):
        out = ARTIFACTS / f"plot-{metrics.count(',') + 1}.png"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        plot = subprocess.run(
            [
                *VIGIL,
                "plot",
                RUN,
                "--metrics",
                metrics,
                "--ranks",
                "0,1",
                "--nats",
                site.nats.url,
                "--data-dir",
                str(tmp_path),
                "-o",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        panels = metrics.count(",") + 1
        assert plot.returncode == 0, plot.stderr[-2000:]
        assert f"({panels} panels)" in plot.stderr
        assert out.stat().st_size > 20_000
        sizes[panels] = _png_size(out)
    assert sizes[4][0] == sizes[2][0] and sizes[4][1] == pytest.approx(2 * sizes[2][1], rel=0.01), "height per panel"


def test_a_run_page_opened_before_the_first_step_draws_its_charts_when_steps_arrive(site: Site, page: object) -> None:
    agent = trainvigil.init("fresh-run", 0, site.nats.url, flush_interval=0.05)
    try:
        assert agent.flush(10)  # its run_start only
        wait_for(lambda: site.get("/api/run?id=fresh-run").status_code == 200, 30, "the run")
        _open(page, site, "/run?id=fresh-run")
        page.wait_for_function("() => document.querySelector('#live').classList.contains('on')", timeout=5000)  # type: ignore[attr-defined]
        for step in range(5):
            agent.log(step, loss=1.0 / (step + 1))
        assert agent.flush(10)
        page.wait_for_function("() => +document.querySelector('#chart-loss')?.dataset.lastStep === 4", timeout=5000)  # type: ignore[attr-defined]
        assert page.locator("#ranks input[data-rank='0']").is_checked()  # type: ignore[attr-defined]
    finally:
        agent.close(5)


# ---- last: it stops the module's daemon ---------------------------------------------------------------


def test_sigterm_stops_the_daemon_promptly_with_a_live_page_open(site: Site, page: object) -> None:
    _open(page, site, "/run?id=" + quote(RUN))
    page.wait_for_function("() => document.querySelector('#live').classList.contains('on')", timeout=5000)  # type: ignore[attr-defined]
    started = time.monotonic()
    assert site.daemon.terminate() == 0
    assert time.monotonic() - started < 10, "an open event stream does not hold the shutdown"
