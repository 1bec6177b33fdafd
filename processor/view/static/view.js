// The live view's page: polls /api/updates for the records after the ones it has, keeps
// them per counter and redraws each counter's chart as inline SVG (no library, no CDN).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const W = 640, H = 230, ML = 64, MR = 12, MT = 10, MB = 26;
const KEEP_POINTS = 3000;   // per counter, for drawing
const TABLE_ROWS = 25;

const state = {
  meta: null, cursor: { r: 0, l: 0, d: 0 },
  counters: new Map(),      // name -> {name, releases: [], el, svg, latest}
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
function svg(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}
function num(v, digits) { return Number(v).toFixed(digits); }

// x of a release: the end of its tick in wall-clock time (the tick number without it).
function relX(r) {
  return typeof r.tick_start_ms === "number" && typeof r.tick_ms === "number"
    ? r.tick_start_ms + r.tick_ms : r.tick;
}

function counterBox(name) {
  let c = state.counters.get(name);
  if (c) return c;
  const section = el("section", { class: "counter", "data-counter": name,
    "data-releases": "0", "data-last-tick": "" });
  section.append(el("h3", {}, name));
  const latest = el("p", { class: "latest" }, "no release yet");
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `private count of ${name} over time` });
  const key = el("div", { class: "key" });
  key.innerHTML = '<span><i class="sw" style="background:#2f6fdb"></i>private</span>' +
    '<span><i class="sw" style="background:#2f6fdb33"></i>± bound (prob. ≥ 1 − beta)</span>' +
    '<span class="demo-only"><i class="sw" style="background:#d9480f"></i>true count (demo only)</span>';
  section.append(latest, chart, key);
  $("#counters").append(section);
  c = { name, releases: [], el: section, svg: chart, latest };
  state.counters.set(name, c);
  return c;
}

function truthOf(name) {
  const d = state.demo;
  if (!d || !d.truth || !d.truth[name]) return [];
  const start = d.start_ms && d.start_ms[name], tick = d.tick_ms;
  if (typeof start !== "number" || typeof tick !== "number") return [];
  return d.truth[name].map(([t, s]) => [start + t * tick, s]);
}

function niceTicks(lo, hi, n) {
  const span = hi - lo || 1;
  const step0 = span / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => span / s <= n) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(v);
  return out;
}

function draw(c) {
  const rel = c.releases, truth = truthOf(c.name);
  const g = c.svg;
  while (g.firstChild) g.removeChild(g.firstChild);
  if (!rel.length && !truth.length) {
    const t = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#888" });
    t.textContent = "waiting for the first release…";
    g.append(t);
    return;
  }
  const xs = rel.map(relX).concat(truth.map(p => p[0]));
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x1 === x0) x1 = x0 + 1;
  let lo = Infinity, hi = -Infinity;
  const reach = state.fit ? 0 : 1;  // fitted: the values decide the axis, the band is clipped
  for (const r of rel) { lo = Math.min(lo, r.value - reach * r.error_bound); hi = Math.max(hi, r.value + reach * r.error_bound); }
  for (const [, s] of truth) { lo = Math.min(lo, s); hi = Math.max(hi, s); }
  const pad = (hi - lo) * 0.05 || 1; lo -= pad; hi += pad;
  const X = x => ML + (x - x0) / (x1 - x0) * (W - ML - MR);
  const Y = y => Math.min(H - MB, Math.max(MT, MT + (hi - y) / (hi - lo) * (H - MT - MB)));

  for (const v of niceTicks(lo, hi, 5)) {
    g.append(svg("line", { x1: ML, x2: W - MR, y1: Y(v), y2: Y(v), stroke: "#eee" }));
    const t = svg("text", { x: ML - 6, y: Y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#666" });
    t.textContent = Math.abs(v) >= 1000 ? v.toExponential(1) : String(Math.round(v * 100) / 100);
    g.append(t);
  }
  const timeAxis = rel.length && typeof rel[0].tick_start_ms === "number";
  for (const [x, anchor] of [[x0, "start"], [x1, "end"]]) {
    const t = svg("text", { x: X(x), y: H - 6, "text-anchor": anchor, "font-size": 11, fill: "#666" });
    t.textContent = timeAxis ? clock(x) : `tick ${x}`;
    g.append(t);
  }
  g.append(svg("line", { x1: ML, x2: ML, y1: MT, y2: H - MB, stroke: "#bbb" }));

  if (rel.length) {
    // A release holds until the next one (nothing is published while y stays put), so
    // the value and the band are steps.
    const pts = rel.map(r => [X(relX(r)), r.value, r.error_bound]);
    const end = X(x1);
    let up = "", down = "", line = "";
    pts.forEach(([x, v, b], i) => {
      const nx = i + 1 < pts.length ? pts[i + 1][0] : end;
      up += `${i ? "L" : "M"}${x},${Y(v + b)} L${nx},${Y(v + b)} `;
      down = `L${nx},${Y(v - b)} L${x},${Y(v - b)} ` + down;
      line += `${i ? "L" : "M"}${x},${Y(v)} L${nx},${Y(v)} `;
    });
    g.append(svg("path", { d: up + down + "Z", fill: "#2f6fdb", "fill-opacity": 0.15, stroke: "none" }));
    g.append(svg("path", { d: line, fill: "none", stroke: "#2f6fdb", "stroke-width": 1.6 }));
    for (const r of rel.slice(-150)) {
      g.append(svg("circle", { cx: X(relX(r)), cy: Y(r.value), r: 2.4,
        fill: r.kind === "heartbeat" ? "#fff" : "#2f6fdb", stroke: "#2f6fdb" }));
    }
  }
  if (truth.length) {
    let d = "";
    truth.forEach(([x, s], i) => {
      const nx = i + 1 < truth.length ? truth[i + 1][0] : x1;
      d += `${i ? "L" : "M"}${X(x)},${Y(s)} L${X(nx)},${Y(s)} `;
    });
    g.append(svg("path", { d, fill: "none", stroke: "#d9480f", "stroke-width": 1.4, "stroke-dasharray": "4 2" }));
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
    const cells = [timeAxisLabel(r), r.counter, r.tick, r.kind || "", num(r.value, 2),
      num(r.error_bound, 1), r.beta !== undefined ? r.beta : ""];
    for (const v of cells) tr.append(el("td", {}, String(v)));
    tr.append(el("td", { class: "demo-only" }, String(trueAt(r.counter, r.tick))));
    return tr;
  }));
  $("#ledger tbody").replaceChildren(...state.ledger.map(e => {
    const tr = el("tr", { "data-counter": e.counter,
      title: `privacy unit: ${e.privacy_unit || "?"}; fingerprint ${e.fingerprint || "?"}` });
    for (const v of [e.counter, e.mechanism, e.epsilon, e.delta,
      e.tick_ms !== undefined ? `${e.tick_ms} ms` : "",
      typeof e.start_ms === "number" ? new Date(e.start_ms).toISOString().slice(0, 19) : "",
      (e.fingerprint || "").slice(0, 10)]) {
      tr.append(el("td", {}, String(v)));
    }
    return tr;
  }));
  const dead = (state.demo && state.demo.dead_letters) || {};
  $("#deadletters tbody").replaceChildren(...Object.entries(dead).sort().map(([reason, n]) => {
    const tr = el("tr", { "data-reason": reason });
    tr.append(el("td", {}, reason), el("td", {}, String(n)));
    return tr;
  }));
}

function timeAxisLabel(r) {
  return typeof r.tick_start_ms === "number" ? clock(relX(r)) : "";
}

function updateLatest(c) {
  const r = c.releases[c.releases.length - 1];
  if (!r) return;
  c.el.dataset.releases = String(c.releases.length);
  c.el.dataset.lastTick = String(r.tick);
  c.el.dataset.lastValue = String(r.value);
  c.latest.textContent = `private ${num(r.value, 2)} ± ${num(r.error_bound, 1)}` +
    (r.beta !== undefined ? ` (beta ${r.beta})` : "") +
    ` · tick ${r.tick} (${r.kind || "?"})` +
    (typeof r.tick_start_ms === "number" ? ` · ${clock(relX(r))}` : "") +
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
  status.textContent = `status: ${u.more ? "catching up" : u.status} · ${state.cursor.r} releases · ` +
    `${state.ledger.length} ledger entries · updated ${clock(Date.now())}` +
    (u.unreadable ? ` · ${u.unreadable} unreadable records skipped` : "");
}

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
    for (const c of state.counters.values()) draw(c);
  });
  poll();
}

start();
