// trainvigil's web view: fetches /api/* (read-only queries in the daemon) and draws with uPlot.
// Data reaches the page as text only (textContent), never as markup.
"use strict";
(() => {
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728"];
  const INFO_EVERY_MS = 2000;
  // A run page draws at most MAX_CHARTS charts (a filter picks which) and fetches the ones on screen in
  // batched requests of up to BATCH_METRICS metrics (the daemon's cap per request), fewer with many ranks
  // (about BATCH_SERIES series an answer): a run of hundreds of metrics costs the daemon a few queries.
  const MAX_CHARTS = 60, BATCH_METRICS = 16, BATCH_SERIES = 64;
  const UNITS = { step_time: "s", lr: "", samples: "samples", tokens: "tokens" };
  const EVENTS_PAGE = 20;  // rows of a run's events table a page
  const page = document.body.dataset.page;
  const params = new URLSearchParams(location.search);
  // Read by the browser tests and bench/web.py: live updates applied, their commit-to-page latency (s),
  // and when the first chart was drawn (ms after navigation start).
  const state = { updates: 0, lastCommit: 0, latencies: [], firstChart: null };
  window.vigil = state;

  async function getJSON(url) {
    const resp = await fetch(url, { headers: { Accept: "application/json" } });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || resp.statusText);
    return body;
  }
  function el(tag, attrs = {}, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function td(text, cls) { return el("td", cls ? { class: cls } : {}, text); }
  function fmt(v, digits = 4) {
    if (v === null || v === undefined) return "";
    if (typeof v !== "number") return String(v);
    return Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(2) : +v.toFixed(digits) + "";
  }
  function tick(v) {  // axis labels: three significant digits, so 0.0015 and 0.002 stay apart
    if (v === null || v === 0) return v === 0 ? "0" : "";
    return Math.abs(v) >= 1e5 || Math.abs(v) < 1e-4 ? v.toExponential(1) : String(+v.toPrecision(3));
  }
  function ago(epochS) {
    if (!epochS) return "";
    const s = Math.max(0, Date.now() / 1000 - epochS);
    return s < 60 ? `${s.toFixed(0)} s ago` : s < 3600 ? `${(s / 60).toFixed(0)} min ago` : new Date(epochS * 1000).toLocaleString();
  }
  function runLink(runId) { return el("a", { href: "/run?id=" + encodeURIComponent(runId), class: "mono" }, runId); }
  function fill(tbody, rows, cells) {
    tbody.replaceChildren(...rows.map((r) => { const tr = el("tr"); tr.append(...cells(r)); return tr; }));
  }
  function errorBox(where, err) { where.replaceChildren(el("div", { class: "empty" }, "could not load: " + err.message)); }

  // ---- live updates: one EventSource per visible page, fed by the daemon's commits ----------
  // A notice names the runs that changed; runs: null means "anything may have changed" (the page
  // was hidden, its stream closed: browsers give a host only ~6 connections, so hidden tabs let go).
  function merge(a, b) {
    if (!a) return b;
    const runs = a.runs === null || b.runs === null ? null : [...new Set([...a.runs, ...b.runs])];
    return { runs, alerts: a.alerts || b.alerts, events: a.events || b.events, committed_at: Math.max(a.committed_at, b.committed_at) };
  }
  function live(onCommit) {
    const badge = document.getElementById("live");
    let source = null, busy = false, pending = null;
    async function apply(notice) {
      pending = merge(pending, notice);
      if (busy) return;  // one refresh at a time; what arrives meanwhile is merged into the next
      busy = true;
      try {
        while (pending) {
          const next = pending; pending = null;
          await onCommit(next);
          state.lastCommit = next.committed_at; state.updates++;
          if (next.runs !== null) state.latencies.push(Date.now() / 1000 - next.committed_at);
          if (state.latencies.length > 1000) state.latencies.shift();
        }
      } catch (err) { console.warn("live update failed", err); } finally { busy = false; }
    }
    function connect() {
      source = new EventSource("/api/live");
      source.onopen = () => { badge.textContent = "● live"; badge.classList.add("on"); };
      source.onerror = () => { badge.textContent = "○ reconnecting"; badge.classList.remove("on"); };
      source.addEventListener("commit", (e) => apply(JSON.parse(e.data)));
    }
    document.addEventListener("visibilitychange", () => {
      if (document.hidden && source) {
        source.close(); source = null;
        badge.textContent = "○ paused"; badge.classList.remove("on");
      } else if (!document.hidden && !source) {
        connect();
        apply({ runs: null, alerts: true, events: true, committed_at: Date.now() / 1000 });
      }
    });
    if (!document.hidden) connect();
  }

  // ---- charts ------------------------------------------------------------------------------------
  function ema(ys, weight) {  // TensorBoard's debiased exponential moving average
    if (!weight) return ys;
    let last = 0, n = 0;
    return ys.map((y) => {
      if (y === null || !isFinite(y)) return y;
      last = last * weight + (1 - weight) * y; n++;
      return last / (1 - Math.pow(weight, n));
    });
  }
  function align(seriesByKey, keys, log, smooth) {
    // uPlot wants one shared, sorted x array: the union of every series' x, nulls where a series has none.
    const xs = new Set();
    for (const k of keys) for (const x of (seriesByKey[k] || { x: [] }).x) xs.add(x);
    const x = Float64Array.from([...xs].sort((a, b) => a - b));
    const index = new Map(); x.forEach((v, i) => index.set(v, i));
    const data = [x];
    for (const k of keys) {
      const ys = new Array(x.length).fill(null);
      const s = seriesByKey[k] || { x: [], y: [] };
      s.x.forEach((at, i) => { const y = s.y[i]; ys[index.get(at)] = log && y <= 0 ? null : y; });
      data.push(ema(ys, smooth));
    }
    return data;
  }

  // ---- the x axis: step, or wall time since the run started ----------------------------------------
  // The daemon buckets by step and sends each point's wall time (t, Unix s) beside its step, so the same
  // answer draws either way; zooming always asks for a step range (the time range maps back to steps).
  const TIME_UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"], [0.001, "ms"]];
  function timeUnit(span) {  // the largest unit the visible span holds twice, so ticks read 0, 1.5, 3 min
    for (const [size, name] of TIME_UNITS) if (span >= 2 * size) return [size, name];
    return [0.001, "ms"];
  }
  function timeTicks(u, splits) {
    const [size, name] = timeUnit(u.scales.x.max - u.scales.x.min);
    const labels = splits.map((v) => (v === null ? "" : `${+(v / size).toPrecision(3)} ${name}`));
    u.root.closest(".chart").dataset.xticks = labels.join("|");  // the browser tests read the ticks drawn
    return labels;
  }
  function duration(s) {  // "+1 h 02 min 05 s" for the legend
    const sign = s < 0 ? "−" : "+"; s = Math.abs(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (h) return `${sign}${h} h ${String(m).padStart(2, "0")} min`;
    if (m) return `${sign}${m} min ${sec.toFixed(0).padStart(2, "0")} s`;
    return sec < 1 ? `${sign}${+(sec * 1000).toPrecision(3)} ms` : `${sign}${sec < 10 ? sec.toFixed(2) : sec.toFixed(1)} s`;
  }
  class StepTime {
    // A monotone step <-> x map from the drawn points (x = seconds since start), interpolated between them:
    // marks at steps are placed in time, and a time range chosen by dragging becomes steps to ask for.
    constructor(pairs) {
      pairs.sort((a, b) => a[0] - b[0]);
      let top = -Infinity;
      this.steps = []; this.xs = [];
      for (const [step, x] of pairs) { top = Math.max(top, x); this.steps.push(step); this.xs.push(top); }
    }
    static interp(from, to, v, outside) {
      // Between the drawn points: linear. Outside them: the nearest end, or ±Infinity with `outside`
      // (a mark at a step beyond the zoomed range is not drawn at its edge).
      const n = from.length;
      if (!n) return v;
      if (v < from[0]) return outside ? -Infinity : to[0];
      if (v > from[n - 1]) return outside ? Infinity : to[n - 1];
      let lo = 0, hi = n - 1;
      while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (from[mid] <= v) lo = mid; else hi = mid; }
      const span = from[hi] - from[lo];
      return span ? to[lo] + ((v - from[lo]) / span) * (to[hi] - to[lo]) : to[lo];
    }
    toX(step) { return StepTime.interp(this.steps, this.xs, step, true); }
    toStep(x) { return StepTime.interp(this.xs, this.steps, x); }
    stepsIn(a, b) {
      // The steps to ask for when [a, b] is chosen on the time axis: out to the drawn points around it,
      // so a range that falls in a pause of the run still holds the points on either side.
      const n = this.xs.length;
      if (!n) return [a, b];
      let lo = 0, hi = n - 1;
      while (lo < n - 1 && this.xs[lo + 1] <= a) lo++;
      while (hi > 0 && this.xs[hi - 1] >= b) hi--;
      return [this.steps[lo], this.steps[Math.max(lo, hi)]];
    }
  }
  const IDENTITY = { toX: (v) => v, toStep: (v) => v, stepsIn: (a, b) => [a, b] };

  // ---- one x range for the charts of a run ---------------------------------------------------------
  // Each chart would otherwise range over its own points: the chart of a metric gone NaN would end where it
  // went NaN, its alert band off the edge, while the others ran on. The span is the union of what every
  // chart drew (non-finite points included) and the run's step range, per x axis mode.
  class Span {
    constructor() { this.modes = {}; this.listeners = []; }
    get(mode) { return this.modes[mode] || null; }
    widen(mode, lo, hi) {  // true when the span grew
      if (!isFinite(lo) || !isFinite(hi)) return false;
      const old = this.modes[mode];
      if (old && old[0] <= lo && old[1] >= hi) return false;
      this.modes[mode] = old ? [Math.min(old[0], lo), Math.max(old[1], hi)] : [lo, hi];
      this.listeners.forEach((f) => f(mode));
      return true;
    }
    onChange(f) { this.listeners.push(f); }
  }
  const NONFINITE = { nan: "NaN", "+inf": "+Inf", "-inf": "−Inf" };

  // Only the charts on screen are fetched: at first, and on a live update; one out of view is marked stale
  // and fetched as soon as any of it shows. Ten open pages of six charts each at four updates a second
  // cost the daemon's queries and the browser's drawing, and both share the cores with ingest.
  const onScreen = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const chart = entry.target.chart;
      chart.visible = entry.isIntersecting;
      if (chart.visible && chart.stale) {
        chart.stale = false;
        chart.loading = chart.load().catch((err) => { chart.note.textContent = "could not load: " + err.message; });
      }
      chart.placed();
    }
  });

  function batched(endpoint, query, perBatch) {
    // fetch(metric, range) for charts of one run: the requests made in one turn of the event loop go out
    // together, one per zoom range and at most perBatch() metrics, as {series, truncated} per chart.
    let queue = [];
    async function send(jobs) {
      const q = new URLSearchParams(query());
      for (const job of jobs) q.append("metric", job.metric);
      const range = jobs[0].range;
      if (range) { q.set("lo", Math.floor(range[0])); q.set("hi", Math.ceil(range[1])); }
      try {
        const body = await getJSON(endpoint + "?" + q);
        for (const job of jobs) job.resolve({ series: body.metrics[job.metric] || {}, truncated: body.truncated });
      } catch (err) { for (const job of jobs) job.reject(err); }
    }
    function flush() {
      const groups = new Map();
      for (const job of queue) {
        const key = job.range ? `${Math.floor(job.range[0])}-${Math.ceil(job.range[1])}` : "";
        if (!groups.has(key)) groups.set(key, []);
        groups.get(key).push(job);
      }
      queue = [];
      const size = perBatch();
      for (const jobs of groups.values()) for (let i = 0; i < jobs.length; i += size) send(jobs.slice(i, i + size));
    }
    return (metric, range) => new Promise((resolve, reject) => {
      if (!queue.length) setTimeout(flush, 0);
      queue.push({ metric, range, resolve, reject });
    });
  }

  class Chart {
    // One metric: a series per key (rank, or run and rank), episodes as bands, NaN and ±Inf values as markers
    // at the chart's top (NaN, +Inf) or bottom (−Inf) edge.
    // opts: fetch(metric, range) -> {series, truncated}, keys(keys in the answer),
    // view() -> {log, smooth, label, style, xmode}, origin(key) -> the Unix time the key's run started;
    // optional: span (a Span the charts of a run share), zoom(range) (a drag zooms them all).
    constructor(parent, metric, opts) {
      this.metric = metric; this.opts = opts; this.range = null; this.raw = null; this.keys = [];
      this.box = el("div", { class: "chart", id: "chart-" + metric.replace(/[^A-Za-z0-9_-]/g, "_"), "data-metric": metric });
      this.box.append(el("h3", {}, metric + (UNITS[metric] ? ` (${UNITS[metric]})` : "")));
      this.plotBox = el("div"); this.note = el("div", { class: "note" });
      this.tip = el("div", { class: "tip" });
      this.box.append(this.plotBox, this.note, this.tip);
      parent.append(this.box);
      this.plot = null; this.episodes = []; this.odd = []; this.map = IDENTITY;
      // Not fetched until the observer says it is on screen; ready() waits for that first word.
      this.visible = false; this.stale = true; this.loading = Promise.resolve();
      this.seen = new Promise((resolve) => { this.placed = resolve; });
      this.box.chart = this; onScreen.observe(this.box);
    }
    async ready() { await this.seen; await this.loading; }
    refresh() {  // a live update: zoomed-in charts stay put, charts out of view wait until they are seen
      return this.range ? Promise.resolve() : this.reload();
    }
    reload() {  // new data wanted (ranks chosen, zoom reset): now if on screen, else once it is
      if (!this.visible) { this.stale = true; return Promise.resolve(); }
      return this.load();
    }
    async load() {
      const body = await this.opts.fetch(this.metric, this.range);
      this.raw = body.series;
      this.times = new Map();  // step -> wall time (Unix s), shown beside the hovered step
      for (const s of Object.values(body.series)) s.x.forEach((x, i) => { if (s.t && s.t[i] != null) this.times.set(x, s.t[i]); });
      this.keys = this.opts.keys(Object.keys(body.series));
      // The series' NaN and ±Inf points (the daemon names them: JSON has no number for them), by step.
      this.odd = [];
      for (const k of this.keys) {
        const n = body.series[k].nonfinite;
        if (n) n.x.forEach((step, i) => this.odd.push({ key: k, step, kind: n.v[i], t: n.t[i] }));
      }
      this.odd.sort((a, b) => a.step - b.step);
      const points = Object.values(body.series).reduce((n, s) => Math.max(n, s.x.length), 0);
      const last = Object.values(body.series).reduce((n, s) => Math.max(n, s.x.length ? s.x[s.x.length - 1] : -Infinity), -Infinity);
      const newest = Math.max(last, this.odd.length ? this.odd[this.odd.length - 1].step : -Infinity);
      if (isFinite(newest)) this.box.dataset.lastStep = newest;  // the newest step drawn (the browser tests read it)
      const first = this.odd[0], label = this.opts.view().label;
      this.note.textContent = `${points} points per series` + (body.truncated ? " (cut by the daemon's row limit)" : "") +
        (first ? ` · ${this.odd.length > 1 ? "first non-finite: " : ""}${this.describe(first, label)}` : "") +
        (this.range ? ` · steps ${Math.floor(this.range[0])}–${Math.ceil(this.range[1])}` : "");
      this.draw();
    }
    series(xmode) {
      // The answer as {key: {x, y}} on the chosen axis, and the step <-> x map for marks and zoom.
      if (xmode !== "time") { this.map = IDENTITY; return this.raw; }
      const out = {}, pairs = [];
      for (const k of this.keys) {
        const s = this.raw[k]; if (!s) continue;
        let origin = this.opts.origin(k);
        if (origin == null) origin = Math.min(...s.t.filter((t) => t != null));
        const x = [], y = [];
        s.x.forEach((step, i) => {
          if (s.t[i] == null) return;
          x.push(s.t[i] - origin); y.push(s.y[i]); pairs.push([step, s.t[i] - origin]);
        });
        out[k] = { x, y };
        // The non-finite points place their steps in time too, so their markers and bands land on the axis.
        for (const p of this.odd) if (p.key === k && p.t != null) pairs.push([p.step, p.t - origin]);
      }
      this.map = new StepTime(pairs);
      return out;
    }
    draw() {
      if (!this.raw) return;  // not fetched yet: drawn once it is
      const { log, smooth, label, style, xmode } = this.opts.view();
      const data = align(this.series(xmode), this.keys, log, smooth);
      this.box.dataset.xmode = xmode;
      const sig = this.keys.join("|") + "/" + log + "/" + xmode;
      // What this chart drew, on its x axis: its points and its non-finite markers.
      let lo = data[0].length ? data[0][0] : Infinity, hi = data[0].length ? data[0][data[0].length - 1] : -Infinity;
      for (const p of this.odd) { const x = this.map.toX(p.step); if (isFinite(x)) { lo = Math.min(lo, x); hi = Math.max(hi, x); } }
      this.extent = lo <= hi ? [lo, hi] : null;
      this.xmode = xmode;
      const zoom = () => this.scale();
      if (this.opts.span && this.extent && !this.range) this.opts.span.widen(xmode, ...this.extent);  // may rescale the others
      if (this.plot && this.sig === sig) { this.plot.setData(data, !this.range); zoom(); this.overlay(); return; }
      if (this.plot) this.plot.destroy();
      this.sig = sig;
      const width = Math.max(320, this.box.clientWidth - 18);
      const self = this, time = xmode === "time";
      const xAxis = time ? { label: "wall time since the run started", size: 36, values: timeTicks } : { label: "step", size: 36 };
      this.plot = new uPlot({
        width, height: 220,
        scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
        axes: [
          xAxis,
          { label: this.metric + (UNITS[this.metric] ? ` (${UNITS[this.metric]})` : ""), size: 64, values: (u, splits) => splits.map(tick) },
        ],
        series: [
          { label: time ? "time" : "step", value: (u, v) => (v == null ? "--" : self.xLabel(v, time)) },
          ...this.keys.map((k, i) => ({ label: label(k), width: 1.25, spanGaps: true, points: { show: false }, ...style(k, i) })),
        ],
        cursor: { drag: { x: true, y: false } },
        legend: { live: true },
        hooks: {
          setSelect: [(u) => {
            if (u.select.width < 3) return;
            const [a, b] = [u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x")];
            const range = self.map.stepsIn(a, b);
            u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
            if (self.opts.zoom) self.opts.zoom(range); else { self.range = range; self.load(); }
          }],
          draw: [() => self.overlay()],
          setCursor: [(u) => self.hover(u)],
        },
      }, data, this.plotBox);
      zoom();
      if (state.firstChart === null) state.firstChart = performance.now();
    }
    xLabel(v, time) {
      if (time) return `${duration(v)} · step ${Math.round(this.map.toStep(v))}`;
      const t = this.times && this.times.get(v);
      return t ? `${v} · ${new Date(t * 1000).toLocaleString()}` : String(v);
    }
    scale() {
      // The x range drawn: the zoomed range, else the run's span (the charts of a run share it), else what
      // this chart drew. A zoomed range on the time axis reaches as far as the points go.
      const u = this.plot; if (!u || !this.extent) return;
      let lo, hi;
      if (this.range) {
        [lo, hi] = this.range.map((step) => this.map.toX(step));
        if (!isFinite(lo)) lo = this.extent[0];
        if (!isFinite(hi)) hi = this.extent[1];
      } else {
        [lo, hi] = (this.opts.span && this.opts.span.get(this.xmode)) || this.extent;
      }
      if (hi > lo && (u.scales.x.min !== lo || u.scales.x.max !== hi)) u.setScale("x", { min: lo, max: hi });
    }
    describe(p, label) { return `${this.keys.length > 1 ? label(p.key) + ": " : ""}${NONFINITE[p.kind] || p.kind} at step ${p.step}`; }
    setMarks(episodes) { this.episodes = episodes; this.overlay(); }
    overlay() {
      const u = this.plot; if (!u) return;
      u.over.querySelectorAll(".episode, .nonfinite").forEach((n) => n.remove());
      const [xmin, xmax] = [u.scales.x.min, u.scales.x.max], at = (step) => this.map.toX(step);
      for (const ep of this.episodes) {
        const [first, last] = [at(ep.first_step), at(ep.last_step)];
        if (last < xmin || first > xmax) continue;
        const left = Math.max(0, u.valToPos(Math.max(first, xmin), "x"));
        const right = u.valToPos(Math.min(last, xmax), "x");
        const band = el("div", { class: `episode sev-${ep.severity}`, "data-episode": ep.episode, title: `${ep.detector}: ${ep.message}` });
        band.style.left = left + "px"; band.style.width = Math.max(4, right - left) + "px";
        u.over.append(band);
      }
      // A marker per non-finite point, but one per few pixels at each edge: a metric that stays NaN for a
      // million steps draws a red rule along the edge, not a million nodes.
      const { label } = this.opts.view(), drawn = { high: -Infinity, low: -Infinity };
      for (const p of this.odd) {
        const x = at(p.step);
        if (!(x >= xmin && x <= xmax)) continue;
        const edge = p.kind === "-inf" ? "low" : "high", left = u.valToPos(x, "x");
        if (left - drawn[edge] < 3) continue;
        drawn[edge] = left;
        const mark = el("div", { class: `nonfinite ${edge}`, "data-step": p.step, "data-kind": p.kind, "data-key": p.key, title: this.describe(p, label) });
        mark.style.left = left + "px";
        u.over.append(mark);
      }
    }
    hover(u) {
      const left = u.cursor.left;
      if (left == null || left < 0) { this.tip.style.display = "none"; return; }
      // Within 1/200 of the visible width (as steps), so a one-step band is easy to hit.
      const step = this.map.toStep(u.posToVal(left, "x"));
      const slack = Math.abs(this.map.toStep(u.scales.x.max) - this.map.toStep(u.scales.x.min)) / 200;
      const hits = this.episodes.filter((ep) => step >= ep.first_step - slack && step <= ep.last_step + slack).map((ep) => `${ep.severity} · ${ep.detector}: ${ep.message}`);
      const label = this.opts.view().label, near = new Map();  // each series' non-finite point nearest the cursor
      for (const p of this.odd) {
        const d = Math.abs(p.step - step);
        if (d <= slack && (!near.has(p.key) || d < near.get(p.key)[0])) near.set(p.key, [d, p]);
      }
      hits.push(...[...near.values()].map(([, p]) => this.describe(p, label)));
      if (!hits.length) { this.tip.style.display = "none"; return; }
      this.tip.textContent = hits.join("\n");
      this.tip.style.whiteSpace = "pre-line";
      this.tip.style.display = "block";
      // Beside the cursor, on the side with room, never over the band it describes.
      const x = left + u.over.offsetLeft, room = this.box.clientWidth - x - 16;
      this.tip.style.left = (room > this.tip.offsetWidth ? x + 12 : Math.max(0, x - this.tip.offsetWidth - 12)) + "px";
      this.tip.style.top = "40px";
    }
  }

  function xAxisToggle(charts) {
    // The step/wall-time select, kept in the address (?x=time) so a shared link opens the same view.
    const select = document.getElementById("xaxis");
    if (params.get("x") === "time") select.value = "time";
    select.addEventListener("change", () => {
      const url = new URL(location.href);
      if (select.value === "time") url.searchParams.set("x", "time"); else url.searchParams.delete("x");
      history.replaceState(null, "", url);
      charts().forEach((c) => c.draw());
    });
    return () => select.value;
  }

  // ---- pages -----------------------------------------------------------------------------------
  async function runsPage() {
    const tbody = document.querySelector("#runs tbody");
    const filter = document.getElementById("filter");
    let rows = [];
    const show = () => {
      const f = filter.value.trim().toLowerCase();
      const shown = rows.filter((r) => !f || r.run_id.toLowerCase().includes(f) || (r.status || "").includes(f));
      document.getElementById("count").textContent = `${shown.length} of ${rows.length} runs`;
      fill(tbody, shown, (r) => {
        const alerts = el("td");
        if (r.open_page) alerts.append(el("span", { class: "sev-page" }, `${r.open_page} page `));
        if (r.open_warn) alerts.append(el("span", { class: "sev-warn" }, `${r.open_warn} warn`));
        const link = el("td"); link.append(runLink(r.run_id));
        const status = el("td"); status.append(el("span", { class: "badge " + (r.status || "") }, r.status));
        return [link, status, td(r.ranks, "num"), td(r.last_step, "num"), td(fmt(r.steps_per_s, 1), "num"), td(ago(r.last_seen)), alerts];
      });
    };
    const load = async () => { rows = (await getJSON("/api/runs")).rows; show(); };
    filter.addEventListener("input", show);
    await load();
    live(load);
  }

  // ---- a run's events: one lane of ticks, and a paged table -----------------------------------------------
  function eventLane(box, range) {
    // A tick per event along the run's steps (or the zoomed range); hovering names the events under the cursor.
    const track = box.querySelector(".track"), tip = box.querySelector(".tip");
    const ends = [box.querySelector(".lo"), box.querySelector(".hi")];
    let events = [], placed = [];
    const bad = (ev) => ev.kind === "checkpoint" && ev.detail && ev.detail.includes('"ok":false');
    function draw() {
      box.hidden = !events.length;
      const r = range();
      if (!events.length || !r) return;
      let [lo, hi] = r;
      if (hi <= lo) hi = lo + 1;
      ends[0].textContent = `step ${Math.floor(lo)}`; ends[1].textContent = `step ${Math.ceil(hi)}`;
      placed = [];
      track.replaceChildren(...events.filter((ev) => ev.step >= lo && ev.step <= hi).map((ev) => {
        const at = (ev.step - lo) / (hi - lo);
        const mark = el("div", { class: "tick" + (bad(ev) ? " bad" : ""), "data-kind": ev.kind, "data-step": ev.step });
        mark.style.left = (100 * at).toFixed(3) + "%";
        placed.push([at, ev]);
        return mark;
      }));
    }
    track.addEventListener("mousemove", (e) => {
      const rect = track.getBoundingClientRect(), slack = 4 / Math.max(1, rect.width);
      const at = (e.clientX - rect.left) / Math.max(1, rect.width);
      const hits = placed.filter(([x]) => Math.abs(x - at) <= slack).map(([, ev]) => ev);
      if (!hits.length) { tip.style.display = "none"; return; }
      const lines = hits.slice(0, 6).map((ev) => `${ev.kind} @ step ${ev.step} · rank ${ev.rank}` + (ev.detail ? ` · ${String(ev.detail).slice(0, 80)}` : ""));
      if (hits.length > 6) lines.push(`and ${hits.length - 6} more`);
      tip.textContent = lines.join("\n");
      tip.style.display = "block";
      const x = e.clientX - box.getBoundingClientRect().left, room = box.clientWidth - x - 16;
      tip.style.left = (room > tip.offsetWidth ? x + 12 : Math.max(0, x - tip.offsetWidth - 12)) + "px";
    });
    track.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    return { set(list) { events = list; draw(); }, draw };
  }

  function pagedTable(table, pager, size, cells) {
    // Rows a page at a time; a refresh keeps the page the reader is on (as far as there are pages).
    const tbody = table.querySelector("tbody"), [newest, newer, where, older, oldest] = pager.children;
    let rows = [], at = 0;
    const pages = () => Math.max(1, Math.ceil(rows.length / size));
    function show() {
      at = Math.min(at, pages() - 1);
      fill(tbody, rows.slice(at * size, (at + 1) * size), cells);
      where.textContent = `page ${at + 1} of ${pages()} · ${rows.length} in all`;
      newest.disabled = newer.disabled = at === 0;
      older.disabled = oldest.disabled = at >= pages() - 1;
      pager.hidden = rows.length <= size;
    }
    newest.addEventListener("click", () => { at = 0; show(); });
    newer.addEventListener("click", () => { at = Math.max(0, at - 1); show(); });
    older.addEventListener("click", () => { at++; show(); });
    oldest.addEventListener("click", () => { at = pages() - 1; show(); });
    return { set(list) { rows = list; show(); } };
  }

  // "logged name → detector input" (/api/run's feeds): the names that feed a detector, a row each; those
  // that feed none and the detectors that got no input, in a line under it (a silent detector says why).
  const MAX_UNFED_NAMES = 30;
  function showFeeds(info) {
    const rows = info.feeds || [], fed = rows.filter((f) => f.input !== null), none = rows.filter((f) => f.input === null);
    fill(document.querySelector("#feeds tbody"), fed, (f) => [td(f.name, "mono"),
      td(f.negated ? f.input + " (negated)" : f.input, "mono"), td(f.detectors.join(", "))]);
    const lines = [];
    if (none.length) {
      const some = none.slice(0, MAX_UNFED_NAMES).map((f) => f.name).join(", ");
      lines.push("feed no detector: " + some + (none.length > MAX_UNFED_NAMES ? ` … (${none.length} in all)` : ""));
    }
    const silent = info.unfed || [];
    if (silent.length) lines.push("no input logged for: " + silent.map((u) => `${u.detector} (${u.reads.join(", ")})`).join("; "));
    document.getElementById("unfed").textContent = lines.join(" · ");
  }

  async function runPage() {
    const runId = params.get("id") || "";
    const charts = document.getElementById("charts");
    let info;
    try { info = await getJSON("/api/run?id=" + encodeURIComponent(runId)); } catch (err) { errorBox(charts, err); return; }
    const status = document.getElementById("status");
    status.textContent = info.status; status.className = "badge " + info.status;
    const ranksBox = document.getElementById("ranks");
    const chosen = new Set(), ranks = [];
    ranksBox.append(el("span", { class: "muted" }, "ranks "));
    const addRanks = (list) => {  // a run that has not logged yet has none; new ranks appear as they log
      for (const r of list || []) {
        if (ranks.includes(r)) continue;
        ranks.push(r); chosen.add(String(r));
        const label = el("label"); const box = el("input", { type: "checkbox", "data-rank": r }); box.checked = true;
        box.addEventListener("change", () => { box.checked ? chosen.add(String(r)) : chosen.delete(String(r)); made.forEach((c) => c.reload()); });
        label.append(box, document.createTextNode(" " + r + " ")); ranksBox.append(label);
      }
    };
    addRanks(info.ranks);
    const logBox = document.getElementById("log"), smooth = document.getElementById("smooth");
    const xmode = xAxisToggle(() => all);
    let started = info.first_seen;  // every rank's wall time counts from the run's start
    const seriesQuery = () => {
      const q = { id: runId, nranks: chosen.size };
      if (chosen.size < ranks.length) q.ranks = [...chosen].join(",");
      return q;
    };
    const perBatch = () => Math.max(1, Math.min(BATCH_METRICS, Math.floor(BATCH_SERIES / Math.max(1, chosen.size))));
    // Every chart of the run draws the same x range: the run's steps (or time) so far, or the zoom.
    const span = new Span(), runSteps = (row) => row.last_step != null && span.widen("step", row.first_step, row.last_step);
    let zoomed = null;
    const zoom = (range) => { zoomed = range; made.forEach((c) => { c.range = range; c.reload(); }); lane.draw(); };
    span.onChange(() => { made.forEach((c) => c.scale()); lane.draw(); });
    const lane = eventLane(document.getElementById("event-lane"), () => zoomed || span.get("step"));
    const eventsTable = pagedTable(document.getElementById("events"), document.getElementById("events-pager"), EVENTS_PAGE,
      (e) => [td(e.step, "num"), td(e.rank, "num"), td(e.kind), td(e.detail, "mono")]);
    const opts = {
      span, zoom,
      fetch: batched("/api/run/series", seriesQuery, perBatch),
      keys: (ks) => ks.filter((k) => chosen.has(k)).sort((a, b) => a - b),
      view: () => ({
        log: logBox.checked, smooth: +smooth.value, xmode: xmode(), label: (k) => "rank " + k,
        style: (k, i) => ({ stroke: PALETTE[i % PALETTE.length] }),
      }),
      origin: () => started,
    };
    // The charts shown: the first MAX_CHARTS metrics the filter matches, each made when first shown.
    let metrics = info.metrics, all = [], marked = [[]];
    const made = new Map();
    const filter = document.getElementById("metric-filter"), counted = document.getElementById("metric-count");
    const show = () => {
      const f = filter.value.trim().toLowerCase();
      const matching = metrics.filter((m) => !f || m.toLowerCase().includes(f));
      all = matching.slice(0, MAX_CHARTS).map((m) => {
        if (!made.has(m)) { const chart = new Chart(charts, m, opts); chart.setMarks(...marked); made.set(m, chart); }
        return made.get(m);
      });
      charts.replaceChildren(...all.map((c) => c.box));
      all.forEach((c) => c.draw());  // one shown again may have missed a change of axis, scale or smoothing
      if (!metrics.length) charts.append(el("div", { class: "empty" }, "no metrics logged yet"));
      else if (!all.length) charts.append(el("div", { class: "empty" }, "no metric matches the filter"));
      counted.textContent = matching.length > all.length ? `${all.length} of ${matching.length} metrics shown; filter to see others` : "";
    };
    runSteps(info);
    show();
    showFeeds(info);
    filter.addEventListener("input", show);
    logBox.addEventListener("change", () => all.forEach((c) => c.draw()));
    smooth.addEventListener("input", () => { document.getElementById("smooth-value").textContent = smooth.value; all.forEach((c) => c.draw()); });
    document.getElementById("reset").addEventListener("click", () => zoom(null));
    const marks = async () => {
      const [eps, evs, anomalies] = await Promise.all([
        getJSON("/api/episodes?id=" + encodeURIComponent(runId)),
        getJSON("/api/events?id=" + encodeURIComponent(runId)),
        getJSON("/api/anomalies?id=" + encodeURIComponent(runId)),
      ]);
      marked = [eps.rows];
      made.forEach((c) => c.setMarks(...marked));
      fill(document.querySelector("#anomalies tbody"), anomalies.rows, (a) => [td(a.time), td(a.rank, "num"), td(a.step, "num"), td(a.detector), td(a.severity, "sev-" + a.severity), td(a.state), td(a.message)]);
      // Events go in one lane above the charts and a paged table, newest first: a line per event on every
      // chart would make a barcode of a long run, and a row per event a page thousands of pixels tall.
      const newest = [...evs.rows].sort((a, b) => b.step - a.step || a.rank - b.rank);
      lane.set(newest); eventsTable.set(newest);
    };
    await Promise.all(all.map((c) => c.ready()));
    await marks();
    // The run's row (status, ranks, metrics) is re-read when events came (a start, an end), or every
    // INFO_EVERY_MS while steps come: it scans the whole run, and a new metric can wait that long.
    let infoAt = performance.now();
    live(async (notice) => {
      if (notice.runs !== null && !notice.runs.includes(runId)) return;
      if (notice.events || !all.length || performance.now() - infoAt > INFO_EVERY_MS) {
        infoAt = performance.now();
        const fresh = await getJSON("/api/run?id=" + encodeURIComponent(runId));
        addRanks(fresh.ranks);
        if (fresh.metrics.length !== metrics.length) { metrics = fresh.metrics; show(); showFeeds(fresh); }
        status.textContent = fresh.status; status.className = "badge " + fresh.status;
        started = fresh.first_seen;
        runSteps(fresh);
      }
      await Promise.all([...made.values()].map((c) => c.refresh()));  // those not shown are only marked stale
      if (notice.alerts || notice.events) await marks();
    });
  }

  // Compare's series keys are "<rank>:<run id>" (a rank is digits, so the first ":" splits them).
  function runOf(key) { return key.slice(key.indexOf(":") + 1); }
  function rankOf(key) { return +key.slice(0, key.indexOf(":")); }
  const DASHES = [[], [6, 3], [2, 3], [10, 3, 2, 3], [1, 6]];

  async function comparePage() {
    const picker = document.getElementById("picker"), select = document.getElementById("metric");
    const charts = document.getElementById("charts"), logBox = document.getElementById("log");
    const ranksBox = document.getElementById("ranks");
    const runs = (await getJSON("/api/runs")).rows;
    const byId = new Map(runs.map((r) => [r.run_id, r]));
    const chosen = new Set(params.getAll("id").slice(0, 10));
    // Ranks: rank 0 of each run unless the address says ?ranks=0,1 or ?ranks=all.
    const wanted = params.get("ranks") || "0";
    const rankChoice = new Set(wanted === "all" ? [] : wanted.split(",").filter((r) => /^\d+$/.test(r)).map(Number));
    let everyRank = wanted === "all";
    for (const m of ["loss", "grad_norm", "lr", "step_time", "reward", "entropy", "kl"]) select.append(el("option", { value: m }, m));
    if (params.get("metric")) { if (![...select.options].some((o) => o.value === params.get("metric"))) select.append(el("option", {}, params.get("metric"))); select.value = params.get("metric"); }
    let chart = null;
    const xmode = xAxisToggle(() => (chart ? [chart] : []));
    const remember = () => {  // the choice in the address, so the link reopens the same overlay
      const url = new URL(location.href);
      url.searchParams.delete("id"); chosen.forEach((r) => url.searchParams.append("id", r));
      url.searchParams.set("metric", select.value);
      const ranks = everyRank ? "all" : [...rankChoice].sort((a, b) => a - b).join(",");
      if (ranks === "0") url.searchParams.delete("ranks"); else url.searchParams.set("ranks", ranks);
      history.replaceState(null, "", url);
    };
    const rankBoxes = () => {
      // One box per rank up to the widest chosen run (at most 32), and "all" for every rank of every run.
      const most = Math.min(32, Math.max(1, ...[...chosen].map((r) => (byId.get(r) || {}).ranks || 1)));
      ranksBox.replaceChildren(el("span", { class: "muted" }, "ranks "));
      const all = el("input", { type: "checkbox", "data-rank": "all" }); all.checked = everyRank;
      const allLabel = el("label"); allLabel.append(all, document.createTextNode(" all "));
      for (let r = 0; r < most; r++) {
        const label = el("label"), box = el("input", { type: "checkbox", "data-rank": r });
        box.checked = everyRank || rankChoice.has(r); box.disabled = everyRank;
        box.addEventListener("change", () => { box.checked ? rankChoice.add(r) : rankChoice.delete(r); redraw(); });
        label.append(box, document.createTextNode(" " + r + " ")); ranksBox.append(label);
      }
      all.addEventListener("change", () => {
        everyRank = all.checked;
        if (!everyRank && !rankChoice.size) rankChoice.add(0);  // back from "all": rank 0, not nothing
        rankBoxes(); redraw();
      });
      ranksBox.append(allLabel);
    };
    const redraw = () => {
      remember();
      charts.replaceChildren();
      if (!chosen.size) { charts.append(el("div", { class: "empty" }, "pick runs above")); return Promise.resolve(); }
      if (!everyRank && !rankChoice.size) { charts.append(el("div", { class: "empty" }, "pick a rank above")); return Promise.resolve(); }
      const ids = [...chosen];
      const nseries = ids.reduce((n, r) => n + (everyRank ? (byId.get(r) || {}).ranks || 1 : rankChoice.size), 0);
      chart = new Chart(charts, select.value, {
        fetch: (metric, range) => {
          const q = new URLSearchParams({ metric, nseries });
          ids.forEach((r) => q.append("id", r));
          q.set("ranks", everyRank ? "all" : [...rankChoice].join(","));
          if (range) { q.set("lo", Math.floor(range[0])); q.set("hi", Math.ceil(range[1])); }
          return getJSON("/api/compare?" + q);
        },
        keys: (ks) => ks.filter((k) => chosen.has(runOf(k)))
          .sort((a, b) => ids.indexOf(runOf(a)) - ids.indexOf(runOf(b)) || rankOf(a) - rankOf(b)),
        view: () => ({
          log: logBox.checked, smooth: 0, xmode: xmode(),
          label: (k) => `${runOf(k)} · rank ${rankOf(k)}`,
          // A colour per run, a dash pattern per rank: the legend and the lines read the same way.
          style: (k) => ({ stroke: PALETTE[ids.indexOf(runOf(k)) % PALETTE.length], dash: DASHES[rankOf(k) % DASHES.length] }),
        }),
        origin: (k) => (byId.get(runOf(k)) || {}).first_seen,  // each run from its own start
      });
      return chart.ready();
    };
    for (const r of runs.slice(0, 200)) {
      const label = el("label", { class: "mono" }); const box = el("input", { type: "checkbox" }); box.checked = chosen.has(r.run_id);
      box.addEventListener("change", () => {
        if (box.checked && chosen.size >= 10) { box.checked = false; return; }
        box.checked ? chosen.add(r.run_id) : chosen.delete(r.run_id); rankBoxes(); redraw();
      });
      label.append(box, document.createTextNode(" " + r.run_id)); picker.append(label);
    }
    select.addEventListener("change", redraw); logBox.addEventListener("change", () => chart && chart.draw());
    document.getElementById("reset").addEventListener("click", () => { if (chart) { chart.range = null; chart.load(); } });
    rankBoxes();
    await redraw();
    live(async (notice) => {
      if (chart && (notice.runs === null || notice.runs.some((r) => chosen.has(r)))) await chart.refresh();
    });
  }

  async function alertsPage() {
    const tbody = document.querySelector("#anomalies tbody");
    const load = async () => {
      const rows = (await getJSON("/api/anomalies")).rows;
      fill(tbody, rows, (a) => { const run = el("td"); run.append(runLink(a.run_id)); return [td(a.time), run, td(a.rank, "num"), td(a.step, "num"), td(a.detector), td(a.severity, "sev-" + a.severity), td(a.state), td(a.message)]; });
    };
    await load();
    live(async (notice) => { if (notice.alerts) await load(); });
  }

  const pages = { runs: runsPage, run: runPage, compare: comparePage, alerts: alertsPage };
  (pages[page] || (async () => {}))().then(() => { document.body.dataset.ready = "1"; }, (err) => { document.body.dataset.ready = "error"; console.error(err); });
})();
