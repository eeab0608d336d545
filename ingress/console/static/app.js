"use strict";
// The sluice console: one page per hash (#overview, #queues, #tickets, #dead, #rules).
// Every request goes to this origin: the console's own data under /console/data/ and
// the admin API under /console/api/sluice/v1/ (the server adds the admin token).
// Text from the server is always set with textContent, never parsed as HTML.

const API = "/console/api/sluice/v1";
const DATA = "/console/data";
let csrf = "";
let timer = 0;
let currentPage = "";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fill(tbody, rows) { tbody.replaceChildren(...rows); }

function showError(msg) {
  const e = document.getElementById("error");
  e.textContent = msg || "";
  e.hidden = !msg;
}

// call sends a request and returns the decoded JSON (null for an empty answer). A
// problem answer throws its detail; an expired session goes back to the sign-in page.
async function call(method, path, body) {
  const opts = { method, headers: {}, credentials: "same-origin" };
  if (method !== "GET") opts.headers["X-Sluice-Csrf"] = csrf;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  if (resp.status === 401) {
    location.href = "/console/login";
    throw new Error("signed out");
  }
  const text = await resp.text();
  let data = null;
  if (text) { try { data = JSON.parse(text); } catch (_) { data = { detail: text }; } }
  if (!resp.ok) throw new Error((data && (data.detail || data.title)) || ("HTTP " + resp.status));
  return data;
}

function fmtRate(x) { return x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2); }
function fmtDur(s) {
  if (!s) return "–";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
// fmtPeriod shortens a Go duration: 1h0m0s → 1h, 1m30s stays.
function fmtPeriod(p) { return p.replace(/([hm])0m0s$/, "$1").replace(/([hm])0s$/, "$1"); }
function fmtTime(t) { return t ? new Date(t).toLocaleString() : "–"; }

// ---- overview

const OUTCOMES = ["allowed", "rejected", "deferred", "shadow_rejected", "error", "quota_exhausted", "waited"];
const OUTCOME_COLORS = { allowed: "#2e7d32", rejected: "#c62828", deferred: "#1f6feb", shadow_rejected: "#8e44ad", error: "#b26a00", quota_exhausted: "#5d6b7e", waited: "#00838f" };
const PALETTE = ["#1f6feb", "#c62828", "#2e7d32", "#b26a00", "#8e44ad", "#00838f", "#5d6b7e", "#ad1457"];
let historyAt = 0;
let history = null;

// The overview reads data/cluster: the rates of every replica (or of this process
// only, which the page says), and, every 10 s, the last hour's history.
async function overview() {
  const withHistory = !history || Date.now() - historyAt >= history.step_seconds * 1000;
  const v = await call("GET", DATA + "/cluster" + (withHistory ? "" : "?history=0"));
  if (withHistory) { history = v.history; historyAt = Date.now(); }
  const scope = document.getElementById("scope");
  const n = v.replicas.length;
  scope.textContent = v.scope === "process" ? v.note :
    "Summed over " + n + " replica" + (n === 1 ? "" : "s") + " (each publishes its counters to NATS every " + v.report_seconds + " s)." + (v.note ? " " + v.note : "") +
    (v.refused ? " " + v.refused + " report(s) in the bucket were refused as malformed." : "");
  scope.className = "hint" + (v.scope === "process" || v.note ? " scope-process" : "");
  const measuring = v.replicas.every(r => r.measuring);
  // Outcomes of a newer replica that this page does not know get a card too.
  const outs = [...OUTCOMES, ...Object.keys(v.outcomes).filter(o => !OUTCOMES.includes(o)).sort()];
  document.getElementById("outcome-cards").replaceChildren(...outs.map(o =>
    el("div", { class: "card " + o }, el("div", { class: "v", text: measuring ? "…" : fmtRate(v.outcomes[o] || 0) }),
      el("div", { class: "k", text: o.replaceAll("_", " ") + " /s" }))));
  const byRule = new Map();
  for (const r of v.rules) {
    if (!byRule.has(r.rule)) byRule.set(r.rule, {});
    byRule.get(r.rule)[r.outcome] = r.per_second;
  }
  const rows = [...byRule.keys()].sort().map(rule => {
    const r = byRule.get(rule);
    const total = Object.values(r).reduce((a, x) => a + x, 0);
    return el("tr", {}, el("td", { text: rule }),
      ...OUTCOMES.map(o => el("td", { class: "num", text: fmtRate(r[o] || 0) })),
      el("td", { class: "num", text: fmtRate(total) }));
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 8, class: "hint", text: measuring ? "Measuring: rates need two reports." : "No rule has decided anything yet." })));
  if (v.truncated) rows.push(el("tr", {}, el("td", { colSpan: 8, class: "hint", text: "More rules than shown." })));
  fill(document.querySelector("#decisions tbody"), rows);
  fill(document.querySelector("#replicas tbody"), v.replicas.map(r => el("tr", { "data-replica": r.id },
    el("td", { text: (r.host || "–") + (r.self ? " (this console)" : "") }), el("td", { class: "mono", text: r.id }),
    el("td", { class: "num", text: r.measuring ? "…" : fmtRate(r.per_second) }),
    el("td", { class: "num", text: r.age_seconds.toFixed(0) + " s ago" }))));
  if (withHistory) drawHistory(history);
  const st = await call("GET", API + "/status");
  const deps = Object.entries(st.dependencies || {}).sort();
  const drows = deps.map(([name, d]) => el("tr", {}, el("td", { text: name }),
    el("td", {}, el("span", { class: "badge " + (d.state === "up" ? "ok" : "orphaned"), text: d.state })),
    el("td", { class: "mono", text: (d.last_error ? d.last_error + " " : "") + "since " + fmtTime(d.since) })));
  if (!drows.length) drows.push(el("tr", {}, el("td", { colSpan: 3, class: "hint", text: "No shared dependency (limits in memory, embedded NATS)." })));
  fill(document.querySelector("#deps tbody"), drows);
  setStatus(st.ready ? "ready" : "not ready");
}

function drawHistory(h) {
  document.getElementById("step").textContent = String(h.step_seconds);
  const pts = h.points;
  const t = pts.map(p => new Date(p.at).getTime());
  const seen = new Set(pts.flatMap(p => Object.keys(p.outcomes || {})));
  const outs = [...OUTCOMES, ...[...seen].filter(o => !OUTCOMES.includes(o)).sort()];
  chart("chart-outcomes", t, outs.map((o, i) => ({ name: o.replaceAll("_", " "), color: OUTCOME_COLORS[o] || PALETTE[i % PALETTE.length],
    values: pts.map(p => p.outcomes ? p.outcomes[o] || 0 : null) })).filter(s => s.values.some(x => x > 0) || s.name === "allowed"));
  const names = [...new Set(pts.flatMap(p => p.queues.map(q => q.name)))].sort();
  const at = (p, name) => p.queues.find(q => q.name === name);
  chart("chart-depth", t, names.map((name, i) => ({ name, color: PALETTE[i % PALETTE.length],
    values: pts.map(p => { const q = at(p, name); return q ? q.depth : null; }) })));
  chart("chart-outflow", t, names.flatMap((name, i) => [
    { name: name + " achieved", color: PALETTE[i % PALETTE.length], values: pts.map(p => { const q = at(p, name); return q && q.achieved !== undefined ? q.achieved : null; }) },
    { name: name + " configured", color: PALETTE[i % PALETTE.length], dashed: true, values: pts.map(p => { const q = at(p, name); return q ? q.configured : null; }) }]));
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") e.textContent = v; else e.setAttribute(k, String(v));
  }
  return e;
}

// niceMax rounds a chart's top up to 1, 2 or 5 times a power of ten.
function niceMax(x) {
  if (!(x > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 2, 5, 10]) if (x <= m * p) return m * p;
  return 10 * p;
}

// chart draws lines of series (values aligned with the times t; null: no value) as an
// inline SVG, with a legend.
function chart(id, t, series) {
  const fig = document.getElementById(id);
  const plot = fig.querySelector(".plot");
  const legend = fig.querySelector(".legend");
  fig.dataset.points = String(t.length);
  fig.dataset.series = String(series.length);
  if (t.length < 2 || !series.length) {
    plot.replaceChildren(el("div", { class: "empty", text: t.length < 2 ? "Collecting: a point every " + document.getElementById("step").textContent + " s." : "No queues." }));
    legend.replaceChildren();
    return;
  }
  const W = 520, H = 170, L = 44, R = 8, T = 8, B = 20;
  const t0 = t[0], t1 = Math.max(t[t.length - 1], t0 + 1);
  const top = niceMax(Math.max(0, ...series.flatMap(s => s.values.filter(v => v !== null))));
  const x = v => L + (v - t0) / (t1 - t0) * (W - L - R);
  const y = v => T + (1 - v / top) * (H - T - B);
  const g = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": fig.querySelector("figcaption").textContent });
  for (const f of [0, 0.5, 1]) {
    g.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(top * f), y2: y(top * f) }));
    g.append(svg("text", { x: L - 4, y: y(top * f) + 3, "text-anchor": "end", text: fmtRate(top * f) }));
  }
  const span = t1 - t0 < 600000 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
  const clock = ms => new Date(ms).toLocaleTimeString([], span);
  g.append(svg("text", { x: L, y: H - 5, text: clock(t0) }));
  g.append(svg("text", { x: W - R, y: H - 5, "text-anchor": "end", text: clock(t1) }));
  for (const s of series) {
    let d = "";
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      d += (pen ? "L" : "M") + x(t[i]).toFixed(1) + " " + y(v).toFixed(1);
      pen = true;
    });
    if (d) g.append(svg("path", { class: "line" + (s.dashed ? " dashed" : ""), d, stroke: s.color, "data-series": s.name }));
  }
  plot.replaceChildren(g);
  legend.replaceChildren(...series.map(s => el("span", {}, el("span", { class: "sw", style: "background:" + s.color }), s.name)));
}

function setStatus(s) {
  document.getElementById("status").textContent = s + " · " + new Date().toLocaleTimeString();
}

// ---- queues

async function queueAction(name, action, body) {
  try {
    await call("POST", API + "/queues/" + encodeURIComponent(name) + "/" + action, body);
    showError("");
    await queues();
  } catch (e) { showError(name + ": " + e.message); }
}

async function queues() {
  const data = await call("GET", API + "/queues");
  const rows = data.queues.map(q => {
    const frac = q.max_depth > 0 ? Math.min(q.depth / q.max_depth, 1) : 0;
    const achieved = q.outflow.achieved_per_second;
    const paused = q.paused_until ? new Date(q.paused_until) > new Date() : false;
    const dur = el("input", { value: "15m", "data-queue": q.name, class: "pause-for", title: "pause for (duration)" });
    return el("tr", { "data-queue": q.name },
      el("td", { class: "mono", text: q.name }),
      el("td", {}, q.depth + " / " + q.max_depth,
        el("div", { class: "bar" + (frac >= 0.9 ? " full" : "") }, el("span", { style: "width:" + (frac * 100).toFixed(1) + "%" }))),
      el("td", { text: (achieved === undefined ? "–" : fmtRate(achieved) + "/s") + " / " + q.outflow.configured }),
      el("td", { text: fmtDur(q.oldest_wait_seconds) }),
      el("td", { class: "num", text: q.in_flight }),
      el("td", { class: "paused-until", text: paused ? fmtTime(q.paused_until) : "–" }),
      el("td", {}, q.orphaned ? el("span", { class: "badge orphaned", text: "orphaned" }) : null, " ",
        el("span", { class: "badge " + (paused ? "paused" : "ok"), text: paused ? "paused" : "flowing" })),
      el("td", {}, el("div", { class: "actions" }, dur,
        el("button", { class: "pause", "data-queue": q.name, text: "Pause", onclick: () => queueAction(q.name, "pause", { for: dur.value }) }),
        el("button", { class: "resume", "data-queue": q.name, text: "Resume", disabled: !paused, onclick: () => queueAction(q.name, "resume") }))));
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 8, class: "hint", text: "No queues: no rule defers." })));
  fill(document.querySelector("#queues tbody"), rows);
  setStatus("queues");
}

// ---- tickets

function kv(table, pairs) {
  fill(table.tBodies[0], pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { class: "mono", text: v }))));
  table.hidden = false;
}

async function lookupTicket(ev) {
  ev.preventDefault();
  const t = document.getElementById("ticket-input").value.trim();
  try {
    const r = await call("GET", DATA + "/tickets/" + encodeURIComponent(t));
    showError("");
    kv(document.getElementById("ticket"), [["ticket", r.ticket], ["queue", r.queue], ["rule", r.rule], ["status", r.status],
      ["position", r.position], ["failed attempts", String(r.attempts)], ["last error", r.last_error],
      ["received", fmtTime(r.received_at)], ["updated", fmtTime(r.updated_at)],
      ["next attempt", r.next_attempt_at ? fmtTime(r.next_attempt_at) : ""],
      ["downstream status", r.result_status ? String(r.result_status) : ""],
      ["downstream body", r.result_status ? r.result_bytes + " bytes (not shown)" : ""]]);
  } catch (e) {
    document.getElementById("ticket").hidden = true;
    showError(e.message);
  }
}

// ---- dead letters

async function deadQueues() {
  const sel = document.getElementById("dead-queue");
  const data = await call("GET", API + "/queues");
  const names = data.queues.map(q => q.name);
  const keep = sel.value;
  sel.replaceChildren(...names.map(n => el("option", { value: n, text: n })));
  if (names.includes(keep)) sel.value = keep;
  await deadLetters();
}

async function deadLetters() {
  const q = document.getElementById("dead-queue").value;
  const tbody = document.querySelector("#dead tbody");
  document.getElementById("dead-detail").hidden = true;
  if (!q) { fill(tbody, [el("tr", {}, el("td", { colSpan: 8, class: "hint", text: "No queues." }))]); return; }
  const data = await call("GET", API + "/queues/" + encodeURIComponent(q) + "/dead?limit=200");
  const rows = data.dead_letters.map(d => el("tr", { "data-ticket": d.ticket },
    el("td", { class: "mono", text: d.ticket }), el("td", { text: d.rule || "" }),
    el("td", { class: "mono", text: d.method + " " + d.path + (d.query ? "?" + d.query : "") }),
    el("td", { class: "num", text: d.body_bytes + " B" }),
    el("td", { class: "num", text: d.attempts }), el("td", { text: d.reason }), el("td", { text: fmtTime(d.dead_at) }),
    el("td", {}, el("div", { class: "actions" },
      el("button", { class: "inspect", text: "Inspect", onclick: () => kv(document.getElementById("dead-detail"), [
        ["ticket", d.ticket], ["queue", d.queue], ["rule", d.rule], ["request", d.method + " " + d.path + (d.query ? "?" + d.query : "")],
        ["body", d.body_bytes + " bytes (not shown)"], ["failed attempts", String(d.attempts)], ["reason", d.reason],
        ["received", fmtTime(d.received_at)], ["dead since", fmtTime(d.dead_at)]]) }),
      el("button", { class: "requeue", "data-ticket": d.ticket, text: "Requeue", onclick: () => deadOp("requeue", { tickets: [d.ticket] }) })))));
  if (!rows.length) rows.push(el("tr", {}, el("td", { colSpan: 8, class: "hint", text: "No dead letters in " + q + "." })));
  fill(tbody, rows);
  setStatus("dead letters");
}

async function deadOp(op, body) {
  const q = document.getElementById("dead-queue").value;
  try {
    const path = API + "/queues/" + encodeURIComponent(q) + "/dead";
    const r = op === "requeue" ? await call("POST", path + "/requeue", body) : await call("DELETE", path + "?confirm=true", body);
    showError("");
    setStatus(op === "requeue" ? "requeued " + r.requeued : "purged " + r.purged);
    await deadLetters();
  } catch (e) { showError(e.message); }
}

function purgeAsk() {
  const q = document.getElementById("dead-queue").value;
  if (!q) return;
  document.getElementById("purge-name").textContent = q;
  document.getElementById("purge-input").value = "";
  document.getElementById("purge-confirm").hidden = false;
}

function purgeGo() {
  const q = document.getElementById("dead-queue").value;
  if (document.getElementById("purge-input").value !== q) {
    showError("Type the queue's name exactly to purge its dead letters.");
    return;
  }
  document.getElementById("purge-confirm").hidden = true;
  deadOp("purge", { all: true });
}

// ---- rules

async function rulesPage() {
  const [set, reloads] = await Promise.all([call("GET", API + "/rules"), call("GET", DATA + "/reloads")]);
  const last = reloads.last;
  kv(document.getElementById("rules-meta"), [["version", set.version.slice(0, 12)], ["files", set.files.join(", ")],
    ["summary", set.summary],
    ["reloads", reloads.succeeded + " succeeded, " + reloads.failed + " refused since start"],
    ["last reload", last ? fmtTime(last.at) + (last.ok ? " — active" : " — refused, the previous rules keep serving") : "none since start"],
    ["its errors", last && !last.ok ? (last.problems || [last.error]).join("\n") : ""]]);
  const rows = set.rules.map(r => el("tr", {}, el("td", { class: "mono", text: r.name }),
    el("td", { class: "mono", text: r.domain + ": " + r.descriptor }),
    el("td", { text: r.unlimited ? "unlimited" : r.deny ? "never allowed" : (r.limits || []).map(l => l.rate + "/" + fmtPeriod(l.period) + " " + l.algorithm).join(", ") }),
    el("td", { text: (r.on_limit === "defer" ? "defer → " + r.queue : "reject 429") + (r.shadow ? " (shadow)" : "") + (r.quota ? " (quota mode)" : "") }),
    el("td", { class: "mono", text: r.source })));
  fill(document.querySelector("#rules tbody"), rows);
  setStatus("rules " + set.version.slice(0, 8));
}

async function explain(ev) {
  ev.preventDefault();
  const headers = document.getElementById("ex-headers").value.split("\n").map(s => s.trim()).filter(Boolean);
  const out = document.getElementById("explain");
  try {
    const r = await call("POST", DATA + "/explain", { method: document.getElementById("ex-method").value,
      path: document.getElementById("ex-path").value, headers, ip: document.getElementById("ex-ip").value.trim() });
    showError("");
    if (!r.route) { out.replaceChildren(el("p", { text: "No route matches: the request is not limited." })); return; }
    const parts = [el("p", {}, "Route ", el("b", { text: r.route.name }), " (" + r.route.source + "), domain " + r.route.domain)];
    r.descriptors.forEach((d, i) => {
      let what;
      if (d.missing) what = "skipped: the request has no " + d.missing;
      else if (!d.rule) what = "no descriptor matches: not limited by this list";
      else if (d.replaced_by) what = "rule " + d.rule.name + " replaced by " + d.replaced_by;
      else if (d.duplicate) what = "rule " + d.rule.name + ": counted by an earlier list";
      else what = "rule " + d.rule.name + " — " + (d.rule.unlimited ? "unlimited" : d.rule.deny ? "never allowed" : (d.rule.limits || []).join(", ")) +
        "; over the limit: " + (d.rule.on_limit === "defer" ? "defer to " + d.rule.queue : "reject 429") + (d.rule.shadow ? " (shadow)" : "") + (d.rule.quota ? " (quota mode)" : "");
      parts.push(el("p", { class: "mono" }, "descriptor " + (i + 1) + " [" + d.entries.join(", ") + "]: " + what));
    });
    out.replaceChildren(...parts);
  } catch (e) { out.replaceChildren(); showError(e.message); }
}

// ---- navigation

const PAGES = { overview: [overview, 2000], queues: [queues, 2000], tickets: [null, 0], dead: [deadQueues, 0], rules: [rulesPage, 0] };

async function refresh(fn) {
  try { await fn(); if (document.getElementById("error").dataset.auto) showError(""); } catch (e) {
    showError(e.message);
    document.getElementById("error").dataset.auto = "1";
  }
}

function route() {
  const name = (location.hash.slice(1) || "overview").split("/")[0];
  const page = PAGES[name] ? name : "overview";
  currentPage = page;
  for (const s of document.querySelectorAll(".page")) s.hidden = s.id !== "page-" + page;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.page === page);
  clearInterval(timer);
  showError("");
  const [fn, every] = PAGES[page];
  if (fn) {
    refresh(fn);
    if (every) timer = setInterval(() => { if (currentPage === page) refresh(fn); }, every);
  }
  document.body.dataset.page = page;
  setStatus(page);
}

async function start() {
  const s = await call("GET", "/console/session");
  csrf = s.csrf;
  document.getElementById("logout").addEventListener("click", async () => {
    try { await call("POST", "/console/logout"); } finally { location.href = "/console/"; }
  });
  document.getElementById("ticket-form").addEventListener("submit", lookupTicket);
  document.getElementById("dead-queue").addEventListener("change", () => refresh(deadLetters));
  document.getElementById("dead-refresh").addEventListener("click", () => refresh(deadLetters));
  document.getElementById("dead-requeue-all").addEventListener("click", () => deadOp("requeue", { all: true }));
  document.getElementById("dead-purge").addEventListener("click", purgeAsk);
  document.getElementById("purge-go").addEventListener("click", purgeGo);
  document.getElementById("purge-cancel").addEventListener("click", () => { document.getElementById("purge-confirm").hidden = true; });
  document.getElementById("explain-form").addEventListener("submit", explain);
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "1";
}

start().catch(e => showError(e.message));
