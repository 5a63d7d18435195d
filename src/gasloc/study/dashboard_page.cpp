// The dashboard page: one HTML document with uPlot and the page's script inline, so that it needs
// nothing but its data (polled from the server, or embedded for `report --html`). The script
// reads the layout of dashboard_json (dashboard.cpp) and draws, per run: training loss per worker,
// validation loss (the average model and each worker's own) with the unigram baseline as a
// horizontal line, consensus distance, MB sent and compute utilization per worker, against step
// or time, with membership changes (died / joined) as vertical lines.
//
// When it has drawn, <body> carries data-charts-drawn (how many charts drew), data-runs and,
// per run section, data-state and data-last-step: what tests read from a headless browser's DOM.
#include <fmt/format.h>

#include "gasloc/core/error.hpp"
#include "gasloc/study/dashboard.hpp"
#include "gasloc/study/dashboard_assets.hpp"

namespace gasloc::study {

namespace {

constexpr const char* kStyle = R"css(
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
header { display: flex; gap: 24px; align-items: baseline; flex-wrap: wrap; }
h1 { font-size: 20px; margin: 0; }
h2 { font-size: 16px; margin: 20px 0 4px; }
.muted { color: #666; }
.error { color: #b00; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 12px; }
.chart { border: 1px solid #ddd; border-radius: 4px; padding: 6px; min-height: 80px; }
.chart h3 { font-size: 13px; margin: 0 0 4px; font-weight: 600; }
.legend-note { font-size: 12px; color: #666; margin-top: 2px; }
)css";

// The page's script. GASLOC is set before it: {dataUrl, refreshMs, embedded}.
constexpr const char* kScript = R"js(
"use strict";
const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];
const charts = new Map();   // "run/chart" -> {plot, signature}
const drawn = new Set();    // charts that drew at least once
let xMode = "step";
let lastData = null;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// The curves of each chart of one run: [{title, yLabel, curves: [{label, x, y, color, width, dash}],
// baseline, views}].
function chartsOf(run) {
  const xs = (s) => xMode === "step" ? s.step : s.time;
  const ids = Object.keys(run.workers).sort((a, b) => a - b);
  const perWorker = (field, scale) => ids.map((id, i) => ({
    label: "worker " + id, x: xs(run.workers[id]),
    y: run.workers[id][field].map(v => v === null ? null : v * scale), color: palette[i % palette.length], width: 1.5 }));
  const own = Object.keys(run.eval.own).sort((a, b) => a - b).map((id, i) => ({
    label: "worker " + id + " own", x: xs(run.eval.own[id]), y: run.eval.own[id].val_loss,
    color: palette[i % palette.length], width: 1, dash: [4, 3] }));
  const average = { label: "average model", x: xs(run.eval), y: run.eval.val_loss, color: "#000", width: 2.5 };
  const consensus = { label: "consensus distance", x: xs(run.eval), y: run.eval.consensus, color: "#9467bd", width: 2 };
  return [
    { key: "train", title: "Training loss", curves: perWorker("train_loss", 1), baseline: run.unigram },
    { key: "val", title: "Validation loss", curves: [average].concat(own), baseline: run.unigram },
    { key: "consensus", title: "Consensus distance (mean squared distance to the average)", curves: [consensus] },
    { key: "bytes", title: "MB sent per worker", curves: perWorker("mb_sent", 1) },
    { key: "util", title: "Compute utilization (%)", curves: perWorker("utilization", 100) },
  ];
}

// Vertical lines where the membership changed: red where workers died, green where they joined.
function viewMarks(views) {
  return (u) => {
    const ctx = u.ctx;
    ctx.save();
    ctx.font = Math.round(10 * devicePixelRatio) + "px sans-serif";
    for (const v of views) {
      const px = u.valToPos(xMode === "step" ? v.step : v.time, "x", true);
      if (!(px >= u.bbox.left && px <= u.bbox.left + u.bbox.width)) continue;
      const died = v.died.length > 0;
      ctx.strokeStyle = ctx.fillStyle = died ? "rgba(200,0,0,0.8)" : "rgba(0,140,0,0.8)";
      ctx.setLineDash([5, 4]);
      ctx.lineWidth = devicePixelRatio;
      ctx.beginPath();
      ctx.moveTo(px, u.bbox.top);
      ctx.lineTo(px, u.bbox.top + u.bbox.height);
      ctx.stroke();
      const text = (died ? "died " + v.died.join(",") : "") + (v.joined.length ? (died ? " " : "") + "joined " + v.joined.join(",") : "");
      ctx.fillText(text, px + 3 * devicePixelRatio, u.bbox.top + 10 * devicePixelRatio);
    }
    ctx.restore();
  };
}

// Tick labels that stay distinct for tiny values (a consensus distance of 1e-5) and huge ones.
function yTicks(u, splits) {
  const largest = Math.max(...splits.map(v => Math.abs(v || 0)));
  const exponent = largest > 0 && (largest < 0.01 || largest >= 1e5);
  return splits.map(v => v === null ? "" : exponent && v !== 0 ? v.toExponential(1) : String(+v.toPrecision(6)));
}

// uPlot's aligned columns: the union of the curves' x values, each curve null where it has none.
function alignedData(spec) {
  const curves = spec.curves.filter(c => c.x.length > 0 && c.y.some(v => v !== null));
  if (curves.length === 0) return null;
  // A curve's own nulls (a step its worker did not compute) are kept as gaps; the holes join
  // leaves where only another curve has a point are undefined, which uPlot draws across.
  const data = uPlot.join(curves.map(c => [c.x, c.y]), curves.map(c => [1]));
  if (typeof spec.baseline === "number") data.push(data[0].map(() => spec.baseline));
  return { curves, data };
}

function plotOptions(spec, curves, width, views) {
  const series = [{ label: xMode === "step" ? "step" : "time (s)" }];
  for (const c of curves)
    series.push({ label: c.label, stroke: c.color, width: c.width, dash: c.dash, spanGaps: false, points: { show: false } });
  if (typeof spec.baseline === "number")
    series.push({ label: "unigram baseline", stroke: "#888", width: 1.5, dash: [8, 4], points: { show: false } });
  return {
    width, height: 240, series,
    scales: { x: { time: false } },
    axes: [{ label: xMode === "step" ? "step" : "time (s): virtual in-process, wall over processes" },
           { size: 64, values: yTicks }],
    legend: { live: true },
    hooks: { draw: [viewMarks(views), (u) => { drawn.add(u.gaslocKey); document.body.dataset.chartsDrawn = drawn.size; }] },
  };
}

// Creates the chart, or gives an existing one its new data when its series are the same.
function drawChart(box, key, spec, views) {
  const aligned = alignedData(spec);
  const old = charts.get(key);
  if (!aligned) {
    if (old) { old.plot.destroy(); charts.delete(key); drawn.delete(key); }
    box.querySelector(".plot").textContent = "no data yet";
    return;
  }
  const signature = xMode + "|" + aligned.curves.map(c => c.label).join(",") + "|" + (typeof spec.baseline === "number");
  if (old && old.signature === signature) {
    old.views.length = 0;
    old.views.push(...views);
    old.plot.setData(aligned.data);
    return;
  }
  if (old) { old.plot.destroy(); drawn.delete(key); }
  const target = box.querySelector(".plot");
  target.textContent = "";
  const liveViews = views.slice();
  const width = Math.max(300, box.clientWidth - 14);
  const plot = new uPlot(plotOptions(spec, aligned.curves, width, liveViews), aligned.data, target);
  plot.gaslocKey = key;
  charts.set(key, { plot, signature, views: liveViews });
}

function describe(run) {
  const s = run.settings;
  const what = s ? `${s.label}, ${s.optim}, ${s.workers} worker${s.workers === 1 ? "" : "s"}` +
                   `${s.backend !== "inproc" ? " over " + s.backend : ""}${s.elastic ? ", elastic" : ""}, ` +
                   `${s.preset || "custom"} model` : "";
  const steps = s && s.steps ? `step ${run.last_step} of ${s.steps}` : `step ${run.last_step}`;
  const age = run.seconds_since_update === null ? "" : `, last line ${Math.round(run.seconds_since_update)} s ago`;
  const base = typeof run.unigram === "number" ? `, unigram baseline ${run.unigram.toFixed(4)}` : "";
  const churn = run.views.length ? `, ${run.views.length} membership change${run.views.length === 1 ? "" : "s"}` : "";
  return `${run.state}: ${steps}${age}. ${what}${base}${churn}.`;
}

function runSection(run, index) {
  const id = "run-" + index;
  let section = document.getElementById(id);
  if (!section) {
    section = el("section", { id });
    section.append(el("h2"), el("div", { class: "muted about" }), el("div", { class: "error" }), el("div", { class: "charts" }));
    document.getElementById("runs").append(section);
  }
  section.querySelector("h2").textContent = run.name + "  (" + run.dir + ")";
  section.querySelector(".about").textContent = describe(run);
  section.querySelector(".error").textContent = run.error ? "error: " + run.error : "";
  section.dataset.state = run.state;
  section.dataset.lastStep = run.last_step;
  return section;
}

function render(data) {
  lastData = data;
  data.runs.forEach((run, index) => {
    const section = runSection(run, index);
    const grid = section.querySelector(".charts");
    for (const spec of chartsOf(run)) {
      const key = index + "/" + spec.key;
      let box = grid.querySelector(`[data-chart="${spec.key}"]`);
      if (!box) {
        box = el("div", { class: "chart", "data-chart": spec.key });
        box.append(el("h3", {}, spec.title), el("div", { class: "plot" }));
        grid.append(box);
      }
      drawChart(box, key, spec, run.views);
    }
  });
  document.body.dataset.runs = data.runs.length;
  document.getElementById("status").textContent =
    (GASLOC.dataUrl ? "updated " : "written ") + new Date().toLocaleTimeString() + " (data of " + data.generated + ")";
}

function poll() {
  fetch(GASLOC.dataUrl, { cache: "no-store" })
    .then(r => { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
    .then(render)
    .catch(e => { document.getElementById("status").textContent = "cannot reach the dashboard: " + e.message + " (retrying)"; })
    .finally(() => setTimeout(poll, GASLOC.refreshMs));
}

// The x axis: step, or time with #time at the end of the address (a bookmark, a screenshot).
if (location.hash === "#time") xMode = "time";
for (const input of document.querySelectorAll("input[name=x]")) {
  input.checked = input.value === xMode;
  input.addEventListener("change", () => { xMode = input.value; history.replaceState(null, "", xMode === "time" ? "#time" : "#"); if (lastData) render(lastData); });
}
if (GASLOC.dataUrl) poll(); else render(GASLOC.embedded);
)js";

}  // namespace

bool dashboard_assets_available() { return !uplot_js().empty() && !uplot_css().empty(); }

void require_dashboard_assets() {
  if (!dashboard_assets_available())
    throw Error("this gasloc was built without uPlot, the chart library of the dashboard page",
                "run scripts/setup.sh (it fetches the npm package uplot into third_party/uplot), then rebuild: "
                "cmake --build build");
}

std::string dashboard_html(const DashboardPage& page) {
  require_dashboard_assets();
  const bool live = !page.data_url.empty();
  const nlohmann::json settings = {{"dataUrl", page.data_url},
                                   {"refreshMs", static_cast<int64_t>(page.refresh_s * 1000)},
                                   {"embedded", live ? nlohmann::json(nullptr) : page.embedded}};
  std::string title = page.title;
  for (const auto& [from, to] : {std::pair{'&', "&amp;"}, std::pair{'<', "&lt;"}, std::pair{'>', "&gt;"}}) {
    std::string escaped;
    for (const char c : title) escaped += c == from ? std::string(to) : std::string(1, c);
    title = escaped;
  }
  std::string license(uplot_license());
  for (size_t at; (at = license.find("*/")) != std::string::npos;) license.replace(at, 2, "* /");
  return fmt::format(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{uplot_css}</style>
<style>{style}</style>
</head>
<body>
<header><h1>{title}</h1>
<span>x axis: <label><input type="radio" name="x" value="step" checked> step</label>
<label><input type="radio" name="x" value="time"> time</label></span>
<span id="status" class="muted">{status}</span></header>
<div class="legend-note">Dashed grey: the data's unigram baseline. Dashed coloured: each worker's own model.
Vertical lines: workers that died (red) or joined (green).</div>
<div id="runs"></div>
<script>/* uPlot {version}, https://github.com/leeoniya/uPlot
{license} */
{uplot_js}</script>
<script>const GASLOC = {settings};</script>
<script>{script}</script>
</body></html>
)",
                     fmt::arg("title", title), fmt::arg("uplot_css", uplot_css()), fmt::arg("style", kStyle),
                     fmt::arg("status", live ? "loading..." : ""), fmt::arg("version", uplot_version()),
                     fmt::arg("license", license), fmt::arg("uplot_js", uplot_js()),
                     fmt::arg("settings", json_for_html(settings)), fmt::arg("script", kScript));
}

}  // namespace gasloc::study
