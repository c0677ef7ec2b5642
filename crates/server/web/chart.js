// Time-series line charts drawn as SVG for the dashboard: a few lines over the last minutes,
// with y ticks, a time axis counted back from now and a legend with each line's latest value.
// The container keeps the plotted points (`data-series`) so that what a chart shows can be read
// back exactly.
"use strict";

const LineChart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 520;
  const H = 200;
  const PAD = { left: 52, right: 12, top: 10, bottom: 24 };

  const svg = (tag, attrs, text) => {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text != null) el.textContent = text;
    return el;
  };

  // 1, 2 or 5 times a power of ten, so that about four ticks cover `max`.
  function niceStep(max) {
    const raw = max / 4;
    const power = 10 ** Math.floor(Math.log10(raw));
    return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
  }

  function formatValue(v, digits) {
    if (v == null || Number.isNaN(v)) return "–";
    if (Math.abs(v) >= 1000) return v.toFixed(0);
    return v.toFixed(digits);
  }

  // series: [{name, color, points: [[t_ms, y|null], ...]}];
  // options: {unit, digits, yMax, integer, spanMs}
  function draw(container, series, options) {
    const digits = options.digits ?? 1;
    const now = Date.now();
    const span = options.spanMs;
    const values = series.flatMap((s) => s.points.map((p) => p[1]).filter((y) => y != null));
    // Counts get whole ticks and at least 0 to 1; other values at least some range.
    const top = Math.max(options.yMax ?? 0, ...values, options.integer ? 1 : 1e-3);
    const step = options.integer ? Math.max(1, niceStep(top)) : niceStep(top);
    const yTop = Math.ceil(top / step) * step;
    const x = (t) => PAD.left + ((t - (now - span)) / span) * (W - PAD.left - PAD.right);
    const y = (v) => H - PAD.bottom - (v / yTop) * (H - PAD.top - PAD.bottom);

    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" });
    for (let v = 0; v <= yTop + step / 2; v += step) {
      root.append(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), class: "grid" }));
      root.append(svg("text", { x: PAD.left - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, formatValue(v, step < 1 ? 2 : 0)));
    }
    const tick = span <= 120000 ? 15000 : 60000;
    for (let back = 0; back <= span; back += tick) {
      const label = back === 0 ? "now" : tick < 60000 ? `-${back / 1000}s` : `-${back / 60000}m`;
      root.append(svg("text", { x: x(now - back), y: H - 6, class: "tick", "text-anchor": "middle" }, label));
    }
    for (const s of series) {
      // A null value breaks the line (nothing happened in that window).
      let d = "";
      let pen = "M";
      for (const [t, v] of s.points) {
        if (t < now - span) continue;
        if (v == null) { pen = "M"; continue; }
        d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        pen = "L";
      }
      root.append(svg("path", { d, stroke: s.color, class: "series" }));
    }
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of series) {
      const latest = [...s.points].reverse().find((p) => p[1] != null);
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = s.color;
      item.append(swatch, `${s.name} ${latest ? formatValue(latest[1], digits) : "–"}${options.unit || ""}`);
      legend.append(item);
    }
    container.replaceChildren(root, legend);
    container.dataset.series = JSON.stringify(Object.fromEntries(series.map((s) => [s.name, s.points])));
  }

  return { draw };
})();
