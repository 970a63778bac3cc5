"""The HTML report's style sheet and the script that draws its timeline (inline: the page fetches nothing).

The script reads the JSON of ``report/timeline.py`` from ``<script id="timeline-data">`` and draws one SVG panel
per order: a lane per stream (labels in their own column, never over the bars), the memory curve with the HBM
capacity line, and a time axis. Every panel shares one view of one axis: the mouse wheel zooms about the cursor,
a drag pans, a double click or "reset" shows the whole step, in every panel at once. Hovering a bar names it.
Opened as ``report.html#selftest`` it zooms to the second quarter of the step by itself and records every panel's
axis range in ``<body data-selftest>``, which the tests read from headless Chromium.
"""

from __future__ import annotations

COLORS = {"compute": "#3b75af", "other": "#9cc3e4", "blocked": "#d62728", "memory": "#2ca02c", "recompute": "#b07aa1"}
"""bar colours; ``recompute``: a kernel an activation checkpoint reruns in the backward (compute or other)"""
COMM_COLORS = ("#ef8636", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
"""one per process group's comm stream, in the order the groups first appear (as in the Gantt PNG)"""

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.sub { color: #666; margin-top: 0; }
.lead { font-size: 1.05em; margin: 4px 0; max-width: 110ch; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8rem; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6rem 1rem; min-width: 10rem; }
.card .v { font-size: 1.3rem; font-weight: 600; } .card .k { color: #666; font-size: 0.85rem; }
table { border-collapse: collapse; margin-top: 0.5rem; }
th, td { padding: 0.25rem 0.8rem; border-bottom: 1px solid #eee; vertical-align: top; }
th { text-align: left; background: #f6f6f6; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.why { min-width: 16rem; font-size: 0.85rem; color: #444; }
img { max-width: 100%; border: 1px solid #eee; }
.warn { color: #8a1c1c; background: #fdecea; border-left: 4px solid #d62728; padding: 0.4rem 0.8rem; }
.legend { display: flex; flex-wrap: wrap; gap: 0.4rem 1.2rem; margin: 0.6rem 0; font-size: 0.85rem; }
.legend span { display: inline-flex; align-items: center; gap: 0.35rem; }
.legend i { display: inline-block; width: 14px; height: 10px; border-radius: 2px; }
.legend i.line { height: 0; border-top: 2px dashed #d62728; border-radius: 0; }
.legend i.outline { background: #fff; border: 2px solid #d62728; }
.tools { display: flex; gap: 0.5rem; align-items: center; font-size: 0.85rem; color: #555; }
.tools button { font: inherit; padding: 0.1rem 0.6rem; }
.panel { margin: 0.8rem 0 1.2rem 0; }
.panel h3 { font-size: 1rem; margin: 0.2rem 0; }
.panel .body { display: grid; grid-template-columns: 9rem 1fr; }
.panel .labels div { font-size: 0.75rem; color: #444; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.panel svg { width: 100%; display: block; cursor: grab; user-select: none; background: #fcfcfc; }
.panel svg text { font-size: 10px; fill: #555; }
#tip { position: fixed; pointer-events: none; background: #222; color: #fff; font-size: 0.75rem; padding: 0.2rem 0.4rem;
       border-radius: 3px; display: none; z-index: 10; white-space: nowrap; }
"""

JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("timeline-data").textContent);
  var COLORS = JSON.parse(document.getElementById("timeline-colors").textContent);
  var SVG = "http://www.w3.org/2000/svg", LANE = 18, MEM = 70, AXIS = 22;
  var axis = Math.max(data.axis_ns, 1), view = {t0: 0, t1: axis}, panels = [];
  var tip = document.getElementById("tip");

  function el(tag, attrs, parent) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function fmtTime(ns) {
    var a = Math.abs(ns);
    if (a >= 1e9) { return (ns / 1e9).toPrecision(4) + " s"; }
    if (a >= 1e6) { return (ns / 1e6).toPrecision(4) + " ms"; }
    if (a >= 1e3) { return (ns / 1e3).toPrecision(4) + " us"; }
    return Math.round(ns) + " ns";
  }
  function fmtBytes(b) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], k = 0;
    while (Math.abs(b) >= 1024 && k < units.length - 1) { b /= 1024; k += 1; }
    return (k ? b.toFixed(2) : b.toFixed(0)) + " " + units[k];
  }
  function niceStep(span, n) {
    var raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
  }
  var RECOMPUTE = new Set(data.recompute || []);
  function recomputed(bar) { return bar[3] <= 1 && RECOMPUTE.has(bar[4]); }
  function colorOf(order, bar) {
    if (recomputed(bar)) { return COLORS.recompute; }
    if (bar[3] === 0) { return COLORS.compute; }
    if (bar[3] === 1) { return COLORS.other; }
    if (bar[3] === 2) { return COLORS.blocked; }
    var lane = order.lanes[bar[0]];
    return COLORS.comm[(data.comm_lanes[lane] || 0) % COLORS.comm.length];
  }
  function memoryScale() {
    var peak = 1;
    data.orders.forEach(function (o) { peak = Math.max(peak, o.peak_bytes); });
    var cap = data.capacity_bytes;
    return (cap && cap <= 2 * peak) ? Math.max(peak, cap) * 1.05 : peak * 1.05;
  }
  var memMax = memoryScale();

  function build(order, k) {
    var root = document.getElementById("timeline-panels");
    var panel = document.createElement("div");
    panel.className = "panel";
    panel.id = "panel-" + k;
    var head = document.createElement("h3");
    // peak_bytes null: the timeline has no memory data (a replayed profiler trace records none)
    head.textContent = order.label + ": step " + fmtTime(order.makespan_ns) + ", exposed communication " +
      fmtTime(order.exposed_ns) + (order.peak_bytes === null ? ", memory not in the trace" :
                                   ", peak memory " + fmtBytes(order.peak_bytes));
    panel.appendChild(head);
    var body = document.createElement("div");
    body.className = "body";
    var labels = document.createElement("div");
    labels.className = "labels";
    order.lanes.forEach(function (name) {
      var d = document.createElement("div");
      d.style.height = LANE + "px"; d.style.lineHeight = LANE + "px"; d.textContent = name; d.title = name;
      labels.appendChild(d);
    });
    var m = document.createElement("div");
    m.style.height = MEM + "px"; m.style.lineHeight = MEM + "px";
    m.textContent = order.peak_bytes === null ? "memory: not in the trace" : "memory";
    labels.appendChild(m);
    var height = order.lanes.length * LANE + MEM + AXIS;
    var svg = el("svg", {"class": "timeline", height: height, "data-order": k});
    body.appendChild(labels);
    body.appendChild(svg);
    panel.appendChild(body);
    root.appendChild(panel);
    var p = {order: order, svg: svg, height: height};
    attach(p);
    panels.push(p);
  }

  function draw(p) {
    var svg = p.svg, order = p.order, W = svg.clientWidth || 1000;
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var span = view.t1 - view.t0, sx = W / span, lanesH = order.lanes.length * LANE;
    function x(t) { return (t - view.t0) * sx; }
    var bars = el("g", {"class": "bars"}, svg);
    order.bars.forEach(function (b, i) {
      if (b[2] < view.t0 || b[1] > view.t1) { return; }
      var x0 = Math.max(x(b[1]), -1), x1 = Math.min(x(b[2]), W + 1);
      var r = el("rect", {x: x0, y: b[0] * LANE + 2, width: Math.max(x1 - x0, 0.6), height: LANE - 4,
                          fill: colorOf(order, b), "data-i": i}, bars);
      if (b[3] === 3 && b[5] > 0) { r.setAttribute("class", "exposed"); r.setAttribute("stroke", COLORS.blocked);
                                    r.setAttribute("stroke-width", "1.5"); }
      if (recomputed(b)) { r.setAttribute("class", "recompute"); }
    });
    var top = lanesH, base = lanesH + MEM;
    el("line", {x1: 0, x2: W, y1: base, y2: base, stroke: "#ccc"}, svg);
    if (order.peak_bytes !== null) {
      el("text", {x: W - 4, y: top + 10, "text-anchor": "end"}, svg).textContent = fmtBytes(memMax) + " full scale";
    }
    var pts = order.memory, d = "", last = null;
    for (var j = 0; j < pts.length; j++) {
      var y = base - pts[j][1] / memMax * (MEM - 4);
      var xx = Math.min(Math.max(x(pts[j][0]), -1), W + 1);
      d += (d ? "H" + xx.toFixed(1) + "V" + y.toFixed(1) : "M" + xx.toFixed(1) + " " + y.toFixed(1));
      last = y;
    }
    if (d) { el("path", {d: d + "H" + x(order.makespan_ns).toFixed(1), fill: "none", stroke: COLORS.memory,
                         "stroke-width": 1.5, "class": "memory"}, svg); }
    var cap = data.capacity_bytes;
    if (cap && cap <= memMax) {
      var cy = base - cap / memMax * (MEM - 4);
      el("line", {x1: 0, x2: W, y1: cy, y2: cy, stroke: COLORS.blocked, "stroke-dasharray": "5 3",
                  "class": "capacity"}, svg);
      el("text", {x: 4, y: cy - 2}, svg).textContent = "HBM capacity " + fmtBytes(cap);
    }
    var ax = el("g", {"class": "axis", "data-t0": Math.round(view.t0), "data-t1": Math.round(view.t1),
                      "data-axis-ns": axis}, svg);
    var step = niceStep(span, Math.max(2, Math.floor(W / 110)));
    for (var t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      el("line", {x1: x(t), x2: x(t), y1: 0, y2: base + 4, stroke: "#e4e4e4", "class": "tick"}, ax);
      el("text", {x: x(t) + 2, y: base + 16}, ax).textContent = fmtTime(t);
    }
    el("line", {x1: 0, x2: W, y1: top, y2: top, stroke: "#ddd"}, svg);
    p.axis = Math.round(view.t0) + "-" + Math.round(view.t1);
  }

  function setView(t0, t1) {
    var span = Math.min(Math.max(t1 - t0, 1), axis);
    t0 = Math.min(Math.max(t0, 0), axis - span);
    view = {t0: t0, t1: t0 + span};
    panels.forEach(draw);
    document.getElementById("zoom-level").textContent =
      "showing " + fmtTime(view.t0) + " to " + fmtTime(view.t1) + " of " + fmtTime(axis);
  }

  function attach(p) {
    var svg = p.svg, drag = null;
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var r = svg.getBoundingClientRect(), f = ev.deltaY < 0 ? 0.8 : 1.25;
      var t = view.t0 + (ev.clientX - r.left) / r.width * (view.t1 - view.t0);
      setView(t - (t - view.t0) * f, t + (view.t1 - t) * f);
    }, {passive: false});
    svg.addEventListener("mousedown", function (ev) { drag = {x: ev.clientX, t0: view.t0, t1: view.t1}; });
    window.addEventListener("mouseup", function () { drag = null; });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) { return; }
      var dt = (ev.clientX - drag.x) / svg.getBoundingClientRect().width * (drag.t1 - drag.t0);
      setView(drag.t0 - dt, drag.t1 - dt);
    });
    svg.addEventListener("dblclick", function () { setView(0, axis); });
    svg.addEventListener("mouseover", function (ev) {
      var i = ev.target.getAttribute && ev.target.getAttribute("data-i");
      if (i === null || i === undefined) { tip.style.display = "none"; return; }
      var b = p.order.bars[+i];
      var kind = (data.kinds || ["compute", "kernel", "waiting on communication", "collective"])[b[3]];
      if (recomputed(b)) { kind += ", recomputed (activation checkpointing)"; }
      tip.textContent = data.names[b[4]] + " (" + kind + ", " + p.order.lanes[b[0]] + "): " +
        fmtTime(b[2] - b[1]) + (b[5] > 0 ? ", exposed " + fmtTime(b[5]) : "");
      tip.style.display = "block";
    });
    svg.addEventListener("mousemove", function (ev) {
      tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
    });
    svg.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  }

  data.orders.forEach(build);
  document.getElementById("zoom-in").addEventListener("click", function () {
    var s = (view.t1 - view.t0) / 4; setView(view.t0 + s, view.t1 - s); });
  document.getElementById("zoom-out").addEventListener("click", function () {
    var s = (view.t1 - view.t0) / 2; setView(view.t0 - s, view.t1 + s); });
  document.getElementById("zoom-reset").addEventListener("click", function () { setView(0, axis); });
  window.addEventListener("resize", function () { panels.forEach(draw); });
  setView(0, axis);
  if (location.hash === "#selftest") {
    setView(axis / 4, axis / 2);
    document.body.setAttribute("data-selftest", panels.map(function (p) { return p.axis; }).join("|"));
  }
  document.body.setAttribute("data-timeline", "drawn " + panels.length);
})();
"""
