// The live dashboard: polls GET /stats every two seconds for the samples it has not seen, keeps
// the server's window of history, and redraws the charts and the since-start-up table. A hidden
// tab does not poll, and a closed one leaves nothing behind on the server.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#2563eb", "#d97706", "#dc2626", "#059669"];
const dash = { samples: [], historyMs: 300000, lastT: 0 };

const ms = (s) => (s == null ? null : s * 1000);
const pct = (f) => (f == null ? null : f * 100);

// Each row: id, label, the value from the totals (in base units) and how to show it.
const TOTAL_ROWS = [
  ["requests", "Requests finished", (t) => t.requests, (v) => String(v)],
  ["prompt-tokens", "Prompt tokens", (t) => t.prompt_tokens, (v) => String(v)],
  ["generation-tokens", "Generated tokens", (t) => t.generation_tokens, (v) => String(v)],
  ["running", "Running now", (t) => t.running, (v) => String(v)],
  ["waiting", "Waiting now", (t) => t.waiting, (v) => String(v)],
  ["kv-usage", "KV-cache usage now", (t) => t.kv_cache_usage, (v) => `${(v * 100).toFixed(1)} %`],
  ["ttft-p50", "TTFT p50", (t) => t.ttft_s.p50, (v) => `${(v * 1000).toFixed(1)} ms`],
  ["ttft-p90", "TTFT p90", (t) => t.ttft_s.p90, (v) => `${(v * 1000).toFixed(1)} ms`],
  ["ttft-p99", "TTFT p99", (t) => t.ttft_s.p99, (v) => `${(v * 1000).toFixed(1)} ms`],
  ["itl-p50", "ITL p50", (t) => t.itl_s.p50, (v) => `${(v * 1000).toFixed(1)} ms`],
  ["itl-p90", "ITL p90", (t) => t.itl_s.p90, (v) => `${(v * 1000).toFixed(1)} ms`],
  ["itl-p99", "ITL p99", (t) => t.itl_s.p99, (v) => `${(v * 1000).toFixed(1)} ms`],
  ["prefix-hit-rate", "Prefix-cache hit rate",
    (t) => (t.prefix_cache_queries ? t.prefix_cache_hits / t.prefix_cache_queries : null), (v) => `${(v * 100).toFixed(1)} %`],
  ["preemptions", "Preemptions", (t) => t.preemptions, (v) => String(v)],
  ["spec-acceptance", "Speculative acceptance",
    (t) => (t.spec_draft_tokens ? t.spec_accepted_tokens / t.spec_draft_tokens : null), (v) => `${(v * 100).toFixed(1)} %`],
];

function renderTotals(totals, speculative) {
  const body = document.querySelector("#totals tbody");
  body.replaceChildren();
  for (const [id, label, value, show] of TOTAL_ROWS) {
    if (id === "spec-acceptance" && !speculative) continue;
    const v = value(totals);
    const row = document.createElement("tr");
    const name = document.createElement("th");
    name.textContent = label;
    const cell = document.createElement("td");
    cell.id = `total-${id}`;
    cell.dataset.value = v == null ? "" : String(v);
    cell.textContent = v == null ? "–" : show(v);
    row.append(name, cell);
    body.append(row);
  }
}

function series(name, pick, i) {
  return { name, color: COLORS[i % COLORS.length], points: dash.samples.map((s) => [s.t, pick(s)]) };
}

function renderCharts(speculative) {
  // The last minute at first, growing with the history up to all of it.
  const oldest = dash.samples.length ? dash.samples[0].t : Date.now();
  const opts = { spanMs: Math.min(dash.historyMs, Math.max(60000, Date.now() - oldest)) };
  const percentiles = (key) => ["p50", "p90", "p99"].map((p, i) => series(p, (s) => ms(s[key]?.[p]), i));
  LineChart.draw(document.getElementById("chart-ttft"), percentiles("ttft_s"), { ...opts, unit: " ms" });
  LineChart.draw(document.getElementById("chart-itl"), percentiles("itl_s"), { ...opts, unit: " ms" });
  LineChart.draw(document.getElementById("chart-throughput"),
    [series("tok/s", (s) => s.output_tokens_per_s, 0)], opts);
  LineChart.draw(document.getElementById("chart-requests"),
    [series("running", (s) => s.running, 0), series("waiting", (s) => s.waiting, 1)], { ...opts, digits: 0, integer: true });
  LineChart.draw(document.getElementById("chart-kv"),
    [series("used", (s) => pct(s.kv_cache_usage), 0)], { ...opts, unit: " %", yMax: 100 });
  LineChart.draw(document.getElementById("chart-prefix"),
    [series("hit rate", (s) => pct(s.prefix_cache_hit_rate), 0)], { ...opts, unit: " %", yMax: 100 });
  LineChart.draw(document.getElementById("chart-preemptions"),
    [series("total", (s) => s.preemptions, 2)], { ...opts, digits: 0, integer: true });
  document.getElementById("spec-figure").hidden = !speculative;
  if (speculative) {
    LineChart.draw(document.getElementById("chart-spec"),
      [series("accepted", (s) => pct(s.spec_acceptance_rate), 3)], { ...opts, unit: " %", yMax: 100 });
  }
}

async function poll() {
  if (document.hidden) return;
  try {
    const response = await fetch(`/stats?since=${dash.lastT}`);
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
    const stats = await response.json();
    dash.historyMs = stats.history_s * 1000;
    document.getElementById("model-name").textContent = stats.model;
    document.getElementById("history-minutes").textContent = String(stats.history_s / 60);
    document.getElementById("window-seconds").textContent = String(stats.window_s);
    dash.samples.push(...stats.samples);
    if (dash.samples.length) dash.lastT = dash.samples[dash.samples.length - 1].t;
    dash.samples = dash.samples.filter((s) => s.t >= stats.now - dash.historyMs);
    renderTotals(stats.totals, stats.speculative_decoding);
    renderCharts(stats.speculative_decoding);
    const updated = document.getElementById("updated");
    updated.textContent = `updated ${new Date(stats.now).toLocaleTimeString()}`;
    updated.dataset.now = String(stats.now);
  } catch (e) {
    document.getElementById("updated").textContent = `cannot read /stats: ${e.message}`;
  }
}

poll();
setInterval(poll, POLL_MS);
document.addEventListener("visibilitychange", poll);
