// trainvigil's web view: fetches /api/* (read-only queries in the daemon) and draws with uPlot.
// Data reaches the page as text only (textContent), never as markup.
"use strict";
(() => {
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728"];
  const UNITS = { step_time: "s", lr: "", samples: "samples", tokens: "tokens" };
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
    return { runs, alerts: a.alerts || b.alerts, committed_at: Math.max(a.committed_at, b.committed_at) };
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
        apply({ runs: null, alerts: true, committed_at: Date.now() / 1000 });
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
    const xs = new Set();
    for (const k of keys) for (const x of (seriesByKey[k] || { x: [] }).x) xs.add(x);
    const x = Float64Array.from([...xs].sort((a, b) => a - b));
    const index = new Map(); x.forEach((v, i) => index.set(v, i));
    const data = [x];
    for (const k of keys) {
      const ys = new Array(x.length).fill(null);
      const s = seriesByKey[k] || { x: [], y: [] };
      s.x.forEach((step, i) => { const y = s.y[i]; ys[index.get(step)] = log && y <= 0 ? null : y; });
      data.push(ema(ys, smooth));
    }
    return data;
  }
  class Chart {
    // One metric: a series per key (rank, or run), episodes as bands, events as markers.
    constructor(parent, metric, opts) {
      this.metric = metric; this.opts = opts; this.range = null; this.raw = {}; this.keys = [];
      this.box = el("div", { class: "chart", id: "chart-" + metric.replace(/[^A-Za-z0-9_-]/g, "_"), "data-metric": metric });
      this.box.append(el("h3", {}, metric + (UNITS[metric] ? ` (${UNITS[metric]})` : "")));
      this.plotBox = el("div"); this.note = el("div", { class: "note" });
      this.tip = el("div", { class: "tip" });
      this.box.append(this.plotBox, this.note, this.tip);
      parent.append(this.box);
      this.plot = null; this.episodes = []; this.events = [];
    }
    async load() {
      const q = new URLSearchParams(this.opts.query(this.metric));
      if (this.range) { q.set("lo", Math.floor(this.range[0])); q.set("hi", Math.ceil(this.range[1])); }
      const body = await getJSON(this.opts.endpoint + "?" + q);
      this.raw = body.series;
      this.times = new Map();  // step -> wall time (Unix s), shown beside the hovered step
      for (const s of Object.values(body.series)) s.x.forEach((x, i) => { if (s.t && s.t[i] != null) this.times.set(x, s.t[i]); });
      this.keys = this.opts.keys(Object.keys(body.series));
      const points = Object.values(body.series).reduce((n, s) => Math.max(n, s.x.length), 0);
      const last = Object.values(body.series).reduce((n, s) => Math.max(n, s.x.length ? s.x[s.x.length - 1] : -Infinity), -Infinity);
      if (isFinite(last)) this.box.dataset.lastStep = last;  // the newest step drawn (the browser tests read it)
      this.note.textContent = `${points} points per series` + (body.truncated ? " (cut by the daemon's row limit)" : "") +
        (this.range ? ` · steps ${Math.floor(this.range[0])}–${Math.ceil(this.range[1])}` : "");
      this.draw();
    }
    draw() {
      const { log, smooth, label } = this.opts.view();
      const data = align(this.raw, this.keys, log, smooth);
      const sig = this.keys.join("|") + "/" + log;
      if (this.plot && this.sig === sig) { this.plot.setData(data, !this.range); if (this.range) this.plot.setScale("x", { min: this.range[0], max: this.range[1] }); this.overlay(); return; }
      if (this.plot) this.plot.destroy();
      this.sig = sig;
      const width = Math.max(320, this.box.clientWidth - 18);
      const self = this;
      this.plot = new uPlot({
        width, height: 220,
        scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
        axes: [
          { label: "step", size: 36 },
          { label: this.metric + (UNITS[this.metric] ? ` (${UNITS[this.metric]})` : ""), size: 64, values: (u, splits) => splits.map(tick) },
        ],
        series: [{ label: "step", value: (u, v) => (v == null ? "--" : self.stepLabel(v)) }, ...this.keys.map((k, i) => ({ label: label(k), stroke: PALETTE[i % PALETTE.length], width: 1.25, spanGaps: true, points: { show: false } }))],
        cursor: { drag: { x: true, y: false } },
        legend: { live: true },
        hooks: {
          setSelect: [(u) => {
            if (u.select.width < 3) return;
            self.range = [u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x")];
            u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
            self.load();
          }],
          draw: [() => self.overlay()],
          setCursor: [(u) => self.hover(u)],
        },
      }, data, this.plotBox);
      if (state.firstChart === null) state.firstChart = performance.now();
    }
    stepLabel(step) {
      const t = this.times && this.times.get(step);
      return t ? `${step} · ${new Date(t * 1000).toLocaleString()}` : String(step);
    }
    setMarks(episodes, events) { this.episodes = episodes; this.events = events; this.overlay(); }
    overlay() {
      const u = this.plot; if (!u) return;
      u.over.querySelectorAll(".episode, .event").forEach((n) => n.remove());
      const [xmin, xmax] = [u.scales.x.min, u.scales.x.max];
      for (const ep of this.episodes) {
        if (ep.last_step < xmin || ep.first_step > xmax) continue;
        const left = Math.max(0, u.valToPos(Math.max(ep.first_step, xmin), "x"));
        const right = u.valToPos(Math.min(ep.last_step, xmax), "x");
        const band = el("div", { class: `episode sev-${ep.severity}`, "data-episode": ep.episode, title: `${ep.detector}: ${ep.message}` });
        band.style.left = left + "px"; band.style.width = Math.max(4, right - left) + "px";
        u.over.append(band);
      }
      for (const ev of this.events) {
        if (ev.step < xmin || ev.step > xmax) continue;
        const bad = ev.kind === "checkpoint" && ev.detail && ev.detail.includes('"ok":false');
        const mark = el("div", { class: "event" + (bad ? " bad" : ""), "data-kind": ev.kind, title: `${ev.kind} @ ${ev.step}` });
        mark.style.left = u.valToPos(ev.step, "x") + "px";
        u.over.append(mark);
      }
    }
    hover(u) {
      const left = u.cursor.left;
      if (left == null || left < 0) { this.tip.style.display = "none"; return; }
      const step = u.posToVal(left, "x");
      const slack = (u.scales.x.max - u.scales.x.min) / 200;
      const hits = this.episodes.filter((ep) => step >= ep.first_step - slack && step <= ep.last_step + slack).map((ep) => `${ep.severity} · ${ep.detector}: ${ep.message}`);
      hits.push(...this.events.filter((ev) => Math.abs(ev.step - step) <= slack).map((ev) => `${ev.kind} @ step ${ev.step}`));
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
        box.addEventListener("change", () => { box.checked ? chosen.add(String(r)) : chosen.delete(String(r)); all.forEach((c) => c.load()); });
        label.append(box, document.createTextNode(" " + r + " ")); ranksBox.append(label);
      }
    };
    addRanks(info.ranks);
    const logBox = document.getElementById("log"), smooth = document.getElementById("smooth");
    const opts = {
      endpoint: "/api/series",
      query: (metric) => {
        const q = { id: runId, metric, nranks: chosen.size };
        if (chosen.size < ranks.length) q.ranks = [...chosen].join(",");
        return q;
      },
      keys: (ks) => ks.filter((k) => chosen.has(k)).sort((a, b) => a - b),
      view: () => ({ log: logBox.checked, smooth: +smooth.value, label: (k) => "rank " + k }),
    };
    const all = info.metrics.map((m) => new Chart(charts, m, opts));
    if (!all.length) charts.append(el("div", { class: "empty" }, "no metrics logged yet"));
    logBox.addEventListener("change", () => all.forEach((c) => c.draw()));
    smooth.addEventListener("input", () => { document.getElementById("smooth-value").textContent = smooth.value; all.forEach((c) => c.draw()); });
    document.getElementById("reset").addEventListener("click", () => all.forEach((c) => { c.range = null; c.load(); }));
    const marks = async () => {
      const [eps, evs, anomalies] = await Promise.all([
        getJSON("/api/episodes?id=" + encodeURIComponent(runId)),
        getJSON("/api/events?id=" + encodeURIComponent(runId)),
        getJSON("/api/anomalies?id=" + encodeURIComponent(runId)),
      ]);
      all.forEach((c) => c.setMarks(eps.rows, evs.rows));
      fill(document.querySelector("#anomalies tbody"), anomalies.rows, (a) => [td(a.time), td(a.rank, "num"), td(a.step, "num"), td(a.detector), td(a.severity, "sev-" + a.severity), td(a.state), td(a.message)]);
      fill(document.querySelector("#events tbody"), evs.rows, (e) => [td(e.step, "num"), td(e.rank, "num"), td(e.kind), td(e.detail, "mono")]);
    };
    await Promise.all(all.map((c) => c.load()));
    await marks();
    live(async (notice) => {
      if (notice.runs !== null && !notice.runs.includes(runId)) return;
      const known = new Set(all.map((c) => c.metric));
      const fresh = await getJSON("/api/run?id=" + encodeURIComponent(runId));
      addRanks(fresh.ranks);
      if (fresh.metrics.length && !known.size) charts.replaceChildren();  // the "no metrics yet" note
      for (const m of fresh.metrics) if (!known.has(m)) all.push(new Chart(charts, m, opts));
      status.textContent = fresh.status; status.className = "badge " + fresh.status;
      await Promise.all(all.filter((c) => !c.range).map((c) => c.load()));
      await marks();
    });
  }

  async function comparePage() {
    const picker = document.getElementById("picker"), select = document.getElementById("metric");
    const charts = document.getElementById("charts"), logBox = document.getElementById("log");
    const runs = (await getJSON("/api/runs")).rows;
    const chosen = new Set(params.getAll("id").slice(0, 10));
    for (const m of ["loss", "grad_norm", "lr", "step_time", "reward", "entropy", "kl"]) select.append(el("option", { value: m }, m));
    if (params.get("metric")) { if (![...select.options].some((o) => o.value === params.get("metric"))) select.append(el("option", {}, params.get("metric"))); select.value = params.get("metric"); }
    let chart = null;
    const redraw = () => {
      charts.replaceChildren();
      if (!chosen.size) { charts.append(el("div", { class: "empty" }, "pick runs above")); return Promise.resolve(); }
      const ids = [...chosen];
      chart = new Chart(charts, select.value, {
        endpoint: "/api/compare",
        query: (metric) => { const q = new URLSearchParams({ metric }); ids.forEach((r) => q.append("id", r)); return q; },
        keys: (ks) => ids.filter((r) => ks.includes(r)),
        view: () => ({ log: logBox.checked, smooth: 0, label: (k) => k }),
      });
      return chart.load();
    };
    for (const r of runs.slice(0, 200)) {
      const label = el("label", { class: "mono" }); const box = el("input", { type: "checkbox" }); box.checked = chosen.has(r.run_id);
      box.addEventListener("change", () => {
        if (box.checked && chosen.size >= 10) { box.checked = false; return; }
        box.checked ? chosen.add(r.run_id) : chosen.delete(r.run_id); redraw();
      });
      label.append(box, document.createTextNode(" " + r.run_id)); picker.append(label);
    }
    select.addEventListener("change", redraw); logBox.addEventListener("change", () => chart && chart.draw());
    await redraw();
    live(async (notice) => {
      if (chart && !chart.range && (notice.runs === null || notice.runs.some((r) => chosen.has(r)))) await chart.load();
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
