// "Did it work?": plot a run's metrics.jsonl that the user drops on the page (or chooses).
// The file goes to POST /api/run-metrics on this lab (lab/run_metrics.py computes every series);
// this module only draws the answer as hand-written SVG. Nothing leaves the machine.

import { $, esc, tr } from "./util.js";

const W = 560, H = 190, PAD = { l: 52, r: 12, t: 10, b: 26 };
const PW = 1000, PH = 260; // the phase chart spans the row: a wider box keeps its text at the same size
const LINE_COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#0a7b83"];
// One color per phase of slime/timeline.py PHASES (the server sends the names, in that order).
const PHASE_COLORS = ["#0969da", "#54aeff", "#8250df", "#c297ff", "#bf8700", "#1a7f37", "#4ac26b",
  "#bc4c00", "#fb8f44", "#cf222e", "#0a7b83", "#6e7781", "#d0d7de"];
const CHARTS = ["reward", "eval", "kl", "logp_diff", "mfu"];

const run = { data: null, name: "" }; // the last plotted answer (redrawn on a language change)

// A legend swatch: SVG presentation attributes, not style (the lab's CSP allows no inline style).
const swatch = (color) => `<svg class="swatch" viewBox="0 0 10 10" aria-hidden="true"><rect width="10" height="10" fill="${color}"/></svg>`;

const num = (v) => (Math.abs(v) >= 100 || v === 0 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2));

function scale(lo, hi, a, b) {
  const span = hi - lo || 1;
  return (v) => a + ((v - lo) / span) * (b - a);
}

function axes(xlo, xhi, ylo, yhi, unit = "", w = W, h = H) {
  const x0 = PAD.l, x1 = w - PAD.r, y0 = h - PAD.b, y1 = PAD.t;
  return `<line class="axis" x1="${x0}" y1="${y0}" x2="${x1}" y2="${y0}" stroke="#8c959f"/>` +
    `<line class="axis" x1="${x0}" y1="${y0}" x2="${x0}" y2="${y1}" stroke="#8c959f"/>` +
    `<text x="${x0 - 4}" y="${y0}" text-anchor="end" font-size="11">${esc(num(ylo) + unit)}</text>` +
    `<text x="${x0 - 4}" y="${y1 + 10}" text-anchor="end" font-size="11">${esc(num(yhi) + unit)}</text>` +
    `<text x="${x0}" y="${h - 6}" font-size="11">${esc(tr("runs_step"))} ${xlo}</text>` +
    `<text x="${x1}" y="${h - 6}" text-anchor="end" font-size="11">${xhi}</text>`;
}

// A line chart: one path per series; a null value breaks the line (NaN in the file).
function lineChart(id, series, factor = 1, unit = "") {
  const pts = series.flatMap((s) => s.points.filter((p) => p[1] !== null));
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1] * factor);
  const xlo = Math.min(...xs), xhi = Math.max(...xs);
  let ylo = Math.min(...ys), yhi = Math.max(...ys);
  if (ylo === yhi) { ylo -= 0.5 * (Math.abs(ylo) || 1); yhi += 0.5 * (Math.abs(yhi) || 1); }
  const sx = scale(xlo, xhi === xlo ? xlo + 1 : xhi, PAD.l, W - PAD.r), sy = scale(ylo, yhi, H - PAD.b, PAD.t);
  const paths = series.map((s, i) => {
    let d = "", pen = "M";
    const dots = [];
    for (const [x, y] of s.points) {
      if (y === null) { pen = "M"; continue; }
      d += `${pen}${sx(x).toFixed(1)},${sy(y * factor).toFixed(1)} `;
      pen = "L";
      dots.push(`<circle cx="${sx(x).toFixed(1)}" cy="${sy(y * factor).toFixed(1)}" r="2.2" fill="${LINE_COLORS[i % LINE_COLORS.length]}"><title>${esc(s.key)} ${esc(tr("runs_step"))} ${x}: ${esc(num(y * factor) + unit)}</title></circle>`);
    }
    const n = s.points.filter((p) => p[1] !== null).length;
    return `<path data-series="${esc(s.key)}" data-points="${n}" d="${d.trim()}" fill="none" stroke="${LINE_COLORS[i % LINE_COLORS.length]}" stroke-width="1.6"/>` + dots.join("");
  });
  const legend = series.map((s, i) => `<li data-series="${esc(s.key)}">${swatch(LINE_COLORS[i % LINE_COLORS.length])}<code>${esc(s.key)}</code></li>`).join("");
  return `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(tr("runs_chart_" + id))}" data-chart="${id}">` +
    axes(xlo, xhi, ylo, yhi, unit) + paths.join("") + `</svg><ul class="run-legend">${legend}</ul>`;
}

// The phase timeline: one stacked bar per step, phases bottom-up in the runtime's order.
function phaseChart(ph) {
  const bars = ph.bars;
  const tops = bars.map((b) => b.seconds.reduce((a, v) => a + v, 0));
  const ymax = Math.max(...tops, ...bars.map((b) => b.step_time)) || 1;
  const x0 = PAD.l, x1 = PW - PAD.r, slot = (x1 - x0) / bars.length, bw = Math.max(1, slot * 0.78);
  const sy = scale(0, ymax, PH - PAD.b, PAD.t);
  const used = ph.names.map((_, i) => bars.some((b) => b.seconds[i] > 0));
  const g = bars.map((b, k) => {
    let y = PH - PAD.b;
    const x = x0 + k * slot + (slot - bw) / 2;
    const rects = ph.names.map((name, i) => {
      const v = b.seconds[i];
      if (!(v > 0)) return "";
      const h = (PH - PAD.b) - sy(v);
      y -= h;
      return `<rect data-phase="${esc(name)}" x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${bw.toFixed(1)}" height="${Math.max(h, 0).toFixed(2)}" fill="${PHASE_COLORS[i % PHASE_COLORS.length]}"><title>${esc(tr("runs_step"))} ${b.step} · ${esc(tr("phase_" + name))}: ${num(v)} s</title></rect>`;
    }).join("");
    return `<g data-bar-step="${b.step}" data-step-time="${b.step_time}">${rects}</g>`;
  }).join("");
  const xlo = bars[0].step, xhi = bars[bars.length - 1].step;
  const legend = ph.names.map((name, i) => (used[i]
    ? `<li data-phase="${esc(name)}">${swatch(PHASE_COLORS[i % PHASE_COLORS.length])}${esc(tr("phase_" + name))} <small>${num(ph.totals[i])} s</small></li>`
    : "")).join("");
  const li = ph.names.indexOf(ph.largest);
  const share = ph.step_time ? ((100 * ph.totals[li]) / ph.step_time).toFixed(1) + "%" : "–";
  return `<svg viewBox="0 0 ${PW} ${PH}" role="img" aria-label="${esc(tr("runs_chart_phases"))}" data-chart="phases">` +
    axes(xlo, xhi, 0, ymax, " s", PW, PH) + g + `</svg><ul class="run-legend phases">${legend}</ul>` +
    `<p class="note run-largest" data-largest="${esc(ph.largest)}">${esc(tr("runs_largest", { phase: tr("phase_" + ph.largest), share }))}</p>`;
}

function figure(id, body) {
  return `<figure class="run-chart" data-figure="${id}"><figcaption>${esc(tr("runs_chart_" + id))}</figcaption>${body}</figure>`;
}

export function drawRunPlot() {
  const box = $("#run-charts");
  if (!box || !run.data) return;
  const d = run.data;
  const parts = [`<p class="note run-summary">${esc(tr("runs_summary", { steps: d.steps.length, name: run.name }))}</p>`];
  for (const id of CHARTS) {
    const series = d.charts[id] || [];
    const mfu = id === "mfu";
    parts.push(figure(id, series.length ? lineChart(id, series, mfu ? 100 : 1, mfu ? "%" : "")
      : `<p class="note run-absent" data-absent="${id}">${esc(tr("runs_absent"))}</p>`));
  }
  parts.push(figure("phases", d.phases.bars.length ? phaseChart(d.phases)
    : `<p class="note run-absent" data-absent="phases">${esc(tr("runs_no_timeline"))}</p>`));
  box.innerHTML = parts.join("");
  box.dataset.plotted = String(d.steps.length);
}

function showError(msg) {
  const el = $("#run-error");
  el.textContent = msg;
  el.hidden = !msg;
}

async function plotFile(file) {
  showError("");
  const text = await file.text();
  const lang = document.documentElement.lang.startsWith("zh") ? "zh" : "en"; // errors come back in it
  let res, data;
  try {
    res = await fetch("/api/run-metrics", {
      method: "POST", headers: { "content-type": "application/json", "accept-language": lang },
      body: JSON.stringify({ text, lang }),
    });
    data = await res.json();
  } catch (e) {
    showError(tr("runs_failed", { name: file.name }) + " " + String(e));
    return;
  }
  if (!res.ok) {
    const detail = Array.isArray(data?.detail) ? data.detail.map((x) => x.msg).join("; ") : `HTTP ${res.status}`;
    showError(tr("runs_failed", { name: file.name }) + " " + detail);
    return;
  }
  run.data = data;
  run.name = file.name;
  drawRunPlot();
}

export function bindRunPlot() {
  const drop = $("#run-drop"), input = $("#run-file");
  if (!drop || !input) return;
  input.addEventListener("change", () => {
    const file = input.files[0];
    input.value = "";
    if (file) plotFile(file);
  });
  drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (ev) => {
    ev.preventDefault();
    drop.classList.remove("over");
    const file = ev.dataTransfer?.files?.[0];
    if (file) plotFile(file);
  });
  drop.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); input.click(); } });
}
