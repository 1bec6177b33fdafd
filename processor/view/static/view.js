// The live view's page: polls /api/updates for the records after the ones it has, keeps
// them per counter and draws each counter's chart with uPlot (vendored next to this file:
// uPlot.iife.min.js, MIT; no CDN). Time axis: the end of each release's tick, in this
// browser's time zone, dated; hover shows the values; drag zooms, double-click zooms out.
"use strict";

const KEEP_POINTS = 3000;   // per counter, for drawing
const TABLE_ROWS = 25;
const CHART_H = 240;
const MIN_SPAN_S = 60;     // the shortest time window a chart shows, in seconds
const BLUE = "#2f6fdb", BAND = "rgba(47,111,219,0.14)", BAND_EDGE = "rgba(47,111,219,0.35)";
const TRUE_COLOR = "#d9480f";

const state = {
  meta: null, cursor: { r: 0, l: 0, d: 0 },
  counters: new Map(),      // name -> {name, releases: [], el, box, latest, plot, zoomed}
  recent: [], ledger: [], demo: null, dirty: new Set(),
  fit: false,               // y axis fitted to the values (the band clipped) or to the band
};

function $(sel) { return document.querySelector(sel); }
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function pad2(n) { return String(n).padStart(2, "0"); }
function dateOf(d) { return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}`; }
function clockOf(d, seconds) {
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}` + (seconds ? `:${pad2(d.getSeconds())}` : "");
}
function clock(ms) { return clockOf(new Date(ms), true); }
function stamp(ms) { const d = new Date(ms); return `${dateOf(d)} ${clockOf(d, true)}`; }
function zone() {
  const off = -new Date().getTimezoneOffset(), a = Math.abs(off);
  return `UTC${off < 0 ? "−" : "+"}${pad2(Math.floor(a / 60))}:${pad2(a % 60)}`;
}
function num(v, digits) { return Number(v).toFixed(digits); }
function fmtCount(v) {
  if (v == null) return "–";
  return Math.abs(v) >= 1e5 ? v.toExponential(2) : String(Math.round(v * 100) / 100);
}

// x of a release: the end of its tick in wall-clock ms (null without a tick time).
function relX(r) {
  return typeof r.tick_start_ms === "number" && typeof r.tick_ms === "number"
    ? r.tick_start_ms + r.tick_ms : null;
}

// The time axis' labels: the time of day at each tick mark, with the date under the first
// mark and under every mark where the day changes (a 50-hour window shows its dates).
function timeLabels(u, splits, _axis, _space, incr) {
  let day = null;
  return splits.map(s => {
    const d = new Date(s * 1000);
    let t = clockOf(d, incr < 60);
    if (incr < 1) t += "." + String(d.getMilliseconds()).padStart(3, "0");
    const today = dateOf(d);
    const label = today !== day ? `${t}\n${today}` : t;
    day = today;
    return label;
  });
}

function truthOf(name) {
  const d = state.demo;
  if (!d || !d.truth || !d.truth[name]) return [];
  const start = d.start_ms && d.start_ms[name], tick = d.tick_ms;
  if (typeof start !== "number" || typeof tick !== "number") return [];
  return d.truth[name].map(([t, s]) => [start + t * tick, s]);
}

// The chart's columns: x (seconds), private, upper and lower edge of the band, heartbeat
// dots, and (demo) the true count. A release holds until the next one (nothing is
// published while y stays put), so the value, the band and the truth are carried forward.
function columns(c) {
  const rel = c.releases.filter(r => relX(r) !== null).sort((a, b) => relX(a) - relX(b));
  const truth = truthOf(c.name);
  const xs = Array.from(new Set(rel.map(relX).concat(truth.map(p => p[0])))).sort((a, b) => a - b);
  const out = { x: [], priv: [], up: [], lo: [], hb: [], tru: [], change: [] };
  let ri = 0, ti = 0, cur = null, curT = null;
  let lo = Infinity, hi = -Infinity;
  xs.forEach((x, i) => {
    let at = null;
    while (ri < rel.length && relX(rel[ri]) <= x) { cur = rel[ri]; if (relX(cur) === x) at = cur; ri++; }
    while (ti < truth.length && truth[ti][0] <= x) { curT = truth[ti][1]; ti++; }
    out.x.push(x / 1000);
    out.priv.push(cur ? cur.value : null);
    out.up.push(cur ? cur.value + cur.error_bound : null);
    out.lo.push(cur ? cur.value - cur.error_bound : null);
    out.hb.push(at && at.kind === "heartbeat" ? at.value : null);
    out.tru.push(curT);
    if (at && at.kind !== "heartbeat") out.change.push(i);
    for (const v of [cur ? cur.value : null, curT]) {
      if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    }
  });
  // A window shorter than MIN_SPAN_S (one release, or a few within seconds) would get a
  // time axis of milliseconds, or years for a single point: it starts MIN_SPAN_S before
  // the last point instead, with nothing drawn before the first release.
  const n = out.x.length;
  if (n && out.x[n - 1] - out.x[0] < MIN_SPAN_S) {
    out.x.unshift(out.x[n - 1] - MIN_SPAN_S);
    for (const k of ["priv", "up", "lo", "hb", "tru"]) out[k].unshift(null);
    out.change = out.change.map(i => i + 1);
  }
  out.fit = lo <= hi ? [lo, hi] : null;
  return out;
}

function yRange(c) {
  return (u, min, max) => {
    if (state.fit && c.cols && c.cols.fit) [min, max] = c.cols.fit;
    if (min == null || max == null || !isFinite(min) || !isFinite(max)) return [0, 1];
    const pad = (max - min) * 0.06 || Math.max(1, Math.abs(max) * 0.1);
    return [min - pad, max + pad];
  };
}

function makePlot(c) {
  const demo = !!(state.meta && state.meta.demo);
  const stepped = uPlot.paths.stepped({ align: 1 });
  const value = (u, v) => fmtCount(v);
  const series = [
    { label: "time", value: (u, v) => v == null ? "–" : stamp(v * 1000) },
    { label: "private", stroke: BLUE, width: 2, paths: stepped, value,
      points: { show: true, size: 6, fill: BLUE, stroke: BLUE,
                filter: () => (c.cols ? c.cols.change : []) } },
    { label: "private + bound", stroke: BAND_EDGE, width: 1, paths: stepped, value,
      points: { show: false } },
    { label: "private − bound", stroke: BAND_EDGE, width: 1, paths: stepped, value,
      points: { show: false } },
    { label: "heartbeat", stroke: BLUE, width: 0, paths: () => null, value,
      points: { show: true, size: 6, fill: "#fff", stroke: BLUE, width: 1.5 } },
  ];
  if (demo) {
    series.push({ label: "true (demo only)", stroke: TRUE_COLOR, width: 1.5, dash: [6, 3],
                  paths: stepped, value, points: { show: false } });
  }
  const opts = {
    width: Math.max(300, c.box.clientWidth || 500), height: CHART_H,
    padding: [10, 40, 0, 0],  // room on the right for the last time label and its date
    series,
    bands: [{ series: [2, 3], fill: BAND }],
    scales: { x: { time: true }, y: { range: yRange(c) } },
    axes: [
      { label: `wall-clock time at the end of each tick (${zone()})`, values: timeLabels,
        space: 70, size: 46, labelSize: 18, labelFont: "12px system-ui, sans-serif",
        font: "11px system-ui, sans-serif" },
      { label: "count (events)", values: (u, splits) => splits.map(fmtCount), size: 58,
        labelSize: 18, labelFont: "12px system-ui, sans-serif",
        font: "11px system-ui, sans-serif" },
    ],
    cursor: { drag: { x: true, y: false, setScale: true } },
    legend: { live: true },
    hooks: {
      setSelect: [u => { if (u.select.width > 0) c.zoomed = true; }],
    },
  };
  const plot = new uPlot(opts, data(c), c.box);
  plot.over.addEventListener("dblclick", () => { c.zoomed = false; });
  return plot;
}

function data(c) {
  const k = c.cols;
  const cols = [k.x, k.priv, k.up, k.lo, k.hb];
  if (state.meta && state.meta.demo) cols.push(k.tru);
  return cols;
}

function counterBox(name) {
  let c = state.counters.get(name);
  if (c) return c;
  const section = el("section", { class: "counter", "data-counter": name,
    "data-releases": "0", "data-last-tick": "", "data-truth-points": "0" });
  section.append(el("h3", {}, name));
  const latest = el("p", { class: "latest" }, "no release yet");
  const box = el("div", { class: "chart", role: "img",
    "aria-label": `private count of ${name} over time, with its error band` });
  box.append(el("p", { class: "waiting" }, "waiting for the first release…"));
  section.append(latest, box);
  $("#counters").append(section);
  c = { name, releases: [], el: section, box, latest, plot: null, zoomed: false, cols: null };
  state.counters.set(name, c);
  new ResizeObserver(() => {
    if (c.plot && c.box.clientWidth > 0 && Math.abs(c.plot.width - c.box.clientWidth) > 2) {
      c.plot.setSize({ width: c.box.clientWidth, height: CHART_H });
    }
  }).observe(box);
  return c;
}

function draw(c) {
  c.cols = columns(c);
  c.el.dataset.truthPoints = String(c.cols.tru.filter(v => v !== null).length);
  if (!c.cols.x.length) return;
  if (!c.plot) {
    c.box.replaceChildren();
    c.plot = makePlot(c);
  } else {
    c.plot.setData(data(c), !c.zoomed);  // a zoomed chart keeps its window
  }
}

function trueAt(name, tick) {
  const d = state.demo;
  if (!d || !d.truth || !d.truth[name]) return "";
  let s = "";
  for (const [t, v] of d.truth[name]) { if (t <= tick) s = v; else break; }
  return s;
}

function renderTables() {
  const body = $("#releases tbody");
  body.replaceChildren(...state.recent.slice(-TABLE_ROWS).reverse().map(r => {
    const tr = el("tr", { "data-counter": r.counter, "data-tick": String(r.tick) });
    const x = relX(r);
    const cells = [x !== null ? clock(x) : "", r.counter, r.tick, r.kind || "", num(r.value, 2),
      num(r.error_bound, 1), r.beta !== undefined ? r.beta : ""];
    for (const v of cells) tr.append(el("td", {}, String(v)));
    if (x !== null) tr.cells[0].title = stamp(x);
    tr.append(el("td", { class: "demo-only" }, String(trueAt(r.counter, r.tick))));
    return tr;
  }));
  $("#ledger tbody").replaceChildren(...state.ledger.map(e => {
    const tr = el("tr", { "data-counter": e.counter,
      title: `privacy unit: ${e.privacy_unit || "?"}; noise key id ${e.key_id || "?"}` });
    const cells = [e.counter, e.entry || "created", e.mechanism, e.calibration || "paper",
      e.epsilon, e.delta, typeof e.tick_ms === "number" ? `${e.tick_ms} ms` : "",
      typeof e.start_ms === "number" ? new Date(e.start_ms).toISOString().slice(0, 19).replace("T", " ") : "",
      e.since_tick !== undefined ? e.since_tick : ""];
    for (const v of cells) tr.append(el("td", {}, String(v)));
    tr.append(el("td", { class: "fingerprint" }, e.fingerprint || ""));
    return tr;
  }));
  const dead = (state.demo && state.demo.dead_letters) || {};
  $("#deadletters tbody").replaceChildren(...Object.entries(dead).sort().map(([reason, n]) => {
    const tr = el("tr", { "data-reason": reason });
    tr.append(el("td", {}, reason), el("td", {}, String(n)));
    return tr;
  }));
}

function updateLatest(c) {
  const r = c.releases[c.releases.length - 1];
  if (!r) return;
  c.el.dataset.releases = String(c.releases.length);
  c.el.dataset.lastTick = String(r.tick);
  c.el.dataset.lastValue = String(r.value);
  const x = relX(r);
  c.latest.textContent = `private ${num(r.value, 2)} ± ${num(r.error_bound, 1)}` +
    (r.beta !== undefined ? ` (beta ${r.beta})` : "") +
    ` · tick ${r.tick} (${r.kind || "?"})` +
    (x !== null ? ` · ${stamp(x)}` : "") +
    (r.mechanism ? ` · ${r.mechanism}, eps ${r.epsilon}, delta ${r.delta}` : "");
}

function apply(u) {
  for (const r of u.releases) {
    const c = counterBox(r.counter);
    c.releases.push(r);
    if (c.releases.length > KEEP_POINTS) c.releases.splice(0, c.releases.length - KEEP_POINTS);
    state.dirty.add(c.name);
    state.recent.push(r);
  }
  if (state.recent.length > 4 * TABLE_ROWS) state.recent.splice(0, state.recent.length - TABLE_ROWS);
  for (const e of u.ledger) { state.ledger.push(e); counterBox(e.counter); }
  state.cursor.r = u.releases_next;
  state.cursor.l = u.ledger_next;
  if (u.demo !== undefined) {
    state.demo = u.demo;
    state.cursor.d = u.demo_version;
    for (const name of state.counters.keys()) state.dirty.add(name);
    if (u.demo && u.demo.truth) for (const name of Object.keys(u.demo.truth)) state.dirty.add(counterBox(name).name);
    const note = $("#demo-note");
    note.hidden = !(u.demo && u.demo.note);
    note.textContent = (u.demo && u.demo.note) || "";
  }
  for (const name of state.dirty) { const c = state.counters.get(name); updateLatest(c); draw(c); }
  state.dirty.clear();
  renderTables();
  const status = $("#status");
  status.dataset.status = u.status;
  status.textContent = `status: ${u.more ? "catching up" : u.status} · ` +
    `${counted(state.cursor.r, "release", "releases")} · ` +
    `${counted(state.ledger.length, "ledger entry", "ledger entries")} · updated ${stamp(Date.now())}` +
    (u.unreadable ? ` · ${u.unreadable} unreadable records skipped` : "");
}

function counted(n, one, many) { return `${n} ${n === 1 ? one : many}`; }

async function poll() {
  try {
    const q = `r=${state.cursor.r}&l=${state.cursor.l}&d=${state.cursor.d}`;
    const resp = await fetch(`/api/updates?${q}`, { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const u = await resp.json();
    apply(u);
    if (u.more) { setTimeout(poll, 0); return; }  // catching up on a long topic
  } catch (err) {
    const status = $("#status");
    status.dataset.status = "offline";
    status.textContent = `status: cannot reach the view server (${err.message}); retrying`;
  }
  setTimeout(poll, state.meta ? state.meta.poll_ms : 1000);
}

async function start() {
  const meta = await (await fetch("/api/meta", { cache: "no-store" })).json();
  state.meta = meta;
  if (meta.demo) document.body.classList.add("demo");
  $("#source").textContent = `Reading the public topics only: ${meta.topics.counts} ` +
    `(private counts) and ${meta.topics.ledger} (privacy ledger).` +
    (meta.demo ? " Demo mode: the true count and the dead letters come from the demo " +
      "itself, through a local file; the processor never publishes them." : "");
  $("#counts-topic").textContent = meta.topics.counts;
  $("#ledger-topic").textContent = meta.topics.ledger;
  for (const d of meta.declared) draw(counterBox(d.counter));
  $("#fit").addEventListener("change", ev => {
    state.fit = ev.target.checked;
    for (const c of state.counters.values()) if (c.plot) c.plot.setData(data(c), true);
  });
  poll();
}

// For the browser tests (and the curious): the page's state, read-only by convention.
window.dpcView = state;
start();
