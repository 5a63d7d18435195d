// The dashboard page: one HTML document with uPlot and the page's script inline, so that it needs
// nothing but its data (polled from the server, or embedded for `report --html`). The script
// reads the layout of dashboard_json (dashboard.cpp) and draws, against step or time:
// - with several runs, "Runs compared": one chart per metric with one curve per run (the mean over
//   its workers for per-worker metrics), and a picker that shows or hides a run everywhere;
// - per run, a section (folded while runs are compared): training loss per worker, validation
//   loss (the average model and each worker's own) with the unigram baseline as a horizontal line,
//   consensus distance, MB sent and compute utilization per worker, with membership changes
//   (died / joined) as vertical lines.
//
// When it has drawn, <body> carries data-charts-drawn (how many charts drew) and data-runs; each
// run section data-state and data-last-step; each comparing chart data-run-series (its run curves)
// and data-runs-shown: what tests read from a headless browser's DOM.
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
summary h2 { display: inline; }
summary { cursor: pointer; margin-top: 16px; }
summary .about { margin: 2px 0 6px 18px; }
#picker label { margin-right: 14px; font-weight: 600; cursor: pointer; }
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
const charts = new Map();   // "run/chart" or "overlay/chart" -> {plot, signature, views, runs}
const drawn = new Set();    // charts that drew at least once
let xMode = "step";
const hiddenRuns = new Set();  // names of the runs the picker hides
let lastData = null;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

const xsOf = (s) => xMode === "step" ? s.step : s.time;

// The curves of each chart of one run: [{key, title, curves: [{label, x, y, color, width, dash}],
// baselines}].
function chartsOf(run) {
  const ids = Object.keys(run.workers).sort((a, b) => a - b);
  const perWorker = (field, scale) => ids.map((id, i) => ({
    label: "worker " + id, x: xsOf(run.workers[id]),
    y: run.workers[id][field].map(v => v === null ? null : v * scale), color: palette[i % palette.length], width: 1.5 }));
  const own = Object.keys(run.eval.own).sort((a, b) => a - b).map((id, i) => ({
    label: "worker " + id + " own", x: xsOf(run.eval.own[id]), y: run.eval.own[id].val_loss,
    color: palette[i % palette.length], width: 1, dash: [4, 3] }));
  const average = { label: "average model", x: xsOf(run.eval), y: run.eval.val_loss, color: "#000", width: 2.5 };
  const consensus = { label: "consensus distance", x: xsOf(run.eval), y: run.eval.consensus, color: "#9467bd", width: 2 };
  const baselines = typeof run.unigram === "number" ? [run.unigram] : [];
  return [
    { key: "train", title: "Training loss", curves: perWorker("train_loss", 1), baselines },
    { key: "val", title: "Validation loss", curves: [average].concat(own), baselines },
    { key: "consensus", title: "Consensus distance (mean squared distance to the average)", curves: [consensus] },
    { key: "bytes", title: "MB sent per worker", curves: perWorker("mb_sent", 1) },
    { key: "util", title: "Compute utilization (%)", curves: perWorker("utilization", 100) },
  ];
}

// One run's per-worker field as one curve: at each logged step the mean over the workers that
// computed it (null where none did), at the latest of their times.
function workerMean(run, field, scale) {
  const byStep = new Map();
  for (const w of Object.values(run.workers)) {
    w.step.forEach((step, i) => {
      const at = byStep.get(step) || { sum: 0, n: 0, time: -Infinity };
      if (w[field][i] !== null) { at.sum += w[field][i]; at.n += 1; }
      at.time = Math.max(at.time, w.time[i]);
      byStep.set(step, at);
    });
  }
  const step = [...byStep.keys()].sort((a, b) => a - b);
  return { step, time: step.map(s => byStep.get(s).time),
           y: step.map(s => { const at = byStep.get(s); return at.n ? at.sum / at.n * scale : null; }) };
}

// The charts that compare runs: one per metric, one curve per run, in the run's colour.
function overlayCharts(runs) {
  const perRun = (curveOf) => runs.map((run, i) => Object.assign(
    { label: run.name, run: run.name, color: palette[i % palette.length], width: 2 }, curveOf(run)));
  const evaluated = (field) => (run) => ({ x: xsOf(run.eval), y: run.eval[field] });
  const meanOfWorkers = (field, scale) => (run) => {
    const m = workerMean(run, field, scale);
    return { x: xsOf(m), y: m.y };
  };
  const baselines = [...new Set(runs.map(r => r.unigram).filter(v => typeof v === "number"))];
  return [
    { key: "train", title: "Training loss (mean over each run's workers)", curves: perRun(meanOfWorkers("train_loss", 1)),
      baselines },
    { key: "val", title: "Validation loss (each run's average model)", curves: perRun(evaluated("val_loss")), baselines },
    { key: "consensus", title: "Consensus distance", curves: perRun(evaluated("consensus")) },
    { key: "bytes", title: "MB sent per worker (mean over workers)", curves: perRun(meanOfWorkers("mb_sent", 1)) },
    { key: "util", title: "Compute utilization (%, mean over workers)",
      curves: perRun(meanOfWorkers("utilization", 100)) },
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
  for (const b of spec.baselines || []) data.push(data[0].map(() => b));
  return { curves, data };
}

function plotOptions(spec, curves, width, views) {
  const series = [{ label: xMode === "step" ? "step" : "time (s)" }];
  for (const c of curves)
    series.push({ label: c.label, stroke: c.color, width: c.width, dash: c.dash, spanGaps: false, points: { show: false },
                  show: !hiddenRuns.has(c.run) });
  const baselines = spec.baselines || [];
  for (const b of baselines)
    series.push({ label: "unigram baseline" + (baselines.length > 1 ? " " + b.toFixed(4) : ""), stroke: "#888",
                  width: 1.5, dash: [8, 4], points: { show: false } });
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
  const signature = xMode + "|" + aligned.curves.map(c => c.label).join(",") + "|" + (spec.baselines || []).join(",");
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
  charts.set(key, { plot, signature, views: liveViews, runs: [null].concat(aligned.curves.map(c => c.run)) });
}

// The chart boxes of a grid, made the first time.
function chartBox(grid, spec) {
  let box = grid.querySelector(`[data-chart="${spec.key}"]`);
  if (!box) {
    box = el("div", { class: "chart", "data-chart": spec.key });
    box.append(el("h3", {}, spec.title), el("div", { class: "plot" }));
    grid.append(box);
  }
  return box;
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

// A run's own section: what it is, and its per-worker charts, folded while several runs are
// compared above (opening it draws them).
function runSection(run, index, count) {
  const id = "run-" + index;
  let section = document.getElementById(id);
  if (!section) {
    section = el("details", { id, class: "run" });
    section.open = count === 1;
    const summary = el("summary");
    summary.append(el("h2"), el("div", { class: "muted about" }));
    section.append(summary, el("div", { class: "error" }), el("div", { class: "charts" }));
    section.addEventListener("toggle", () => { if (section.open && lastData) render(lastData); });
    document.getElementById("runs").append(section);
  }
  section.querySelector("h2").textContent = run.name + "  (" + run.dir + ")";
  section.querySelector(".about").textContent = describe(run);
  section.querySelector(".error").textContent = run.error ? "error: " + run.error : "";
  section.dataset.state = run.state;
  section.dataset.lastStep = run.last_step;
  return section;
}

// The picker: one checkbox per run, in its colour, showing or hiding its curves in every chart.
function renderPicker(runs) {
  const picker = document.getElementById("picker");
  if (picker.childElementCount === runs.length) return;  // the runs are fixed for the page's life
  picker.textContent = "";
  runs.forEach((run, i) => {
    const input = el("input", { type: "checkbox", "data-run": run.name });
    input.checked = !hiddenRuns.has(run.name);
    input.addEventListener("change", () => {
      if (input.checked) hiddenRuns.delete(run.name); else hiddenRuns.add(run.name);
      showRuns();
      saveAddress();
    });
    const label = el("label", { class: "pick" });
    label.style.color = palette[i % palette.length];
    label.append(input, " " + run.name);
    picker.append(label);
  });
}

// Applies the picker to the charts that compare runs and to the runs' sections. Each chart box
// says how many run curves it has (data-run-series) and shows (data-runs-shown), for tests.
function showRuns() {
  for (const box of document.querySelectorAll("#overlay .chart")) {
    const chart = charts.get("overlay/" + box.dataset.chart);
    const runs = chart ? chart.runs.filter(r => typeof r === "string") : [];
    if (chart)
      chart.runs.forEach((run, i) => { if (typeof run === "string") chart.plot.setSeries(i, { show: !hiddenRuns.has(run) }); });
    box.dataset.runSeries = runs.length;
    box.dataset.runsShown = runs.filter(r => !hiddenRuns.has(r)).length;
  }
  if (lastData && lastData.runs.length > 1)
    lastData.runs.forEach((run, index) => { document.getElementById("run-" + index).hidden = hiddenRuns.has(run.name); });
}

// The charts comparing runs, above the runs' own sections: only when there are several.
function renderOverlay(runs) {
  const compare = document.getElementById("compare");
  compare.hidden = runs.length < 2;
  if (compare.hidden) return;
  renderPicker(runs);
  const grid = document.getElementById("overlay");
  for (const spec of overlayCharts(runs)) drawChart(chartBox(grid, spec), "overlay/" + spec.key, spec, []);
}

function render(data) {
  lastData = data;
  renderOverlay(data.runs);
  data.runs.forEach((run, index) => {
    const section = runSection(run, index, data.runs.length);
    if (!section.open) return;
    const grid = section.querySelector(".charts");
    for (const spec of chartsOf(run)) drawChart(chartBox(grid, spec), index + "/" + spec.key, spec, run.views);
  });
  showRuns();
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

// The address keeps the view for a bookmark or a screenshot: #time (the x axis), and
// hide=NAME,NAME (runs the picker hides), joined by "&".
function loadAddress() {
  for (const part of location.hash.slice(1).split("&")) {
    if (part === "time") xMode = "time";
    if (part.startsWith("hide=")) part.slice(5).split(",").filter(Boolean).forEach(n => hiddenRuns.add(decodeURIComponent(n)));
  }
}
function saveAddress() {
  const parts = [];
  if (xMode === "time") parts.push("time");
  if (hiddenRuns.size) parts.push("hide=" + [...hiddenRuns].map(encodeURIComponent).join(","));
  history.replaceState(null, "", "#" + parts.join("&"));
}

loadAddress();
for (const input of document.querySelectorAll("input[name=x]")) {
  input.checked = input.value === xMode;
  input.addEventListener("change", () => { xMode = input.value; saveAddress(); if (lastData) render(lastData); });
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
<section id="compare" hidden><h2>Runs compared</h2>
<div class="muted">show: <span id="picker"></span></div>
<div id="overlay" class="charts"></div></section>
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
