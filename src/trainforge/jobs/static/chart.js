// Line charts drawn as SVG: one <path class="series"> per series, with data-points = its number of points.
"use strict";
const tfChart = (function () {
  const NS = "http://www.w3.org/2000/svg";
  const W = 480, H = 260, M = { left: 52, right: 12, top: 22, bottom: 30 };

  function node(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function ticks(lo, hi, n) {
    if (hi === lo) return [lo];
    const out = [];
    for (let i = 0; i <= n; i++) out.push(lo + (hi - lo) * i / n);
    return out;
  }

  function label(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a < 0.01 || a >= 1e5)) return v.toExponential(1);
    return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toFixed(3);
  }

  // series: [{name, points: [[step, value], ...]}]; series i is drawn in color s<i> (s0..s9). opts.legend false:
  // no legend in the chart (the comparison page names its jobs, in their colors, in a table).
  function draw(svg, series, opts) {
    const legend = !opts || opts.legend !== false;
    svg.replaceChildren();
    const all = series.flatMap((s) => s.points);
    if (all.length === 0) {
      svg.appendChild(node("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no data yet"));
      return;
    }
    let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
    let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 = y0 + 1; y0 = y0 - 1; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const sx = (x) => M.left + (x - x0) / (x1 - x0) * (W - M.left - M.right);
    const sy = (y) => H - M.bottom - (y - y0) / (y1 - y0) * (H - M.top - M.bottom);

    for (const t of ticks(y0, y1, 4)) {
      svg.appendChild(node("line", { class: "grid", x1: M.left, x2: W - M.right, y1: sy(t), y2: sy(t) }));
      svg.appendChild(node("text", { x: M.left - 4, y: sy(t) + 4, "text-anchor": "end" }, label(t)));
    }
    for (const t of ticks(x0, x1, 4)) {
      svg.appendChild(node("text", { x: sx(t), y: H - M.bottom + 16, "text-anchor": "middle" }, String(Math.round(t))));
    }
    svg.appendChild(node("line", { class: "axis", x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom }));
    svg.appendChild(node("line", { class: "axis", x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom }));
    svg.appendChild(node("text", { x: W - M.right, y: H - 2, "text-anchor": "end" }, "step"));

    series.forEach((s, i) => {
      if (s.points.length === 0) return;
      const d = s.points.map((p, j) => (j ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
      svg.appendChild(node("path", { class: "series s" + i, d: d, "data-series": s.name, "data-points": s.points.length }));
      if (s.points.length === 1) {
        const p = s.points[0];
        svg.appendChild(node("circle", { class: "s" + i, cx: sx(p[0]), cy: sy(p[1]), r: 3 }));
      }
      if (legend) svg.appendChild(node("text", { class: "legend s" + i, x: M.left + 8 + i * 110, y: 14 }, s.name));
    });
  }

  return { draw: draw };
})();
