// The explorer page's training run: followed live while train.py writes it (the
// slider gains each new snapshot and the timeline each evaluation, without a
// reload), drawn against the step (the val loss, the in-context learning score,
// every head's induction score and where a head's label changed), and played
// through, step by step. Also the heads view's composition grid. explorer.js
// holds the state; the page loads this file after it.
"use strict";

const POLL_MS = 500; // how often the page asks whether the run has changed
const PLAY_DWELL_MS = 600; // how long play rests on a step once it is drawn
const CHART_LEFT = 58; // pixels left of a chart's plot, for the value axis
const CHART_PAD = 14; // pixels above, right of and below the plot, but for the step axis

// ---------------------------------------------------------------------------
// Following the run

// ask whether the run changed; returns whether the answer brought anything new
async function loadTimeline() {
  const since = state.timeline ? `?since=${encodeURIComponent(state.timeline.version)}` : "";
  const response = await fetch(`/api/timeline${since}`);
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error);
  if (!answer.changed) return false;
  const last = state.steps.length - 1;
  const wasOnLast = state.steps.length > 0 && state.steps.indexOf(shownStep()) === last;
  const before = state.steps[last];
  state.timeline = answer;
  setSteps(answer);
  // the slider follows the newest step while it sits on the last, as a terminal scrolls
  const newest = state.steps[state.steps.length - 1];
  if (wasOnLast && !state.playing && newest !== before && newest !== undefined) {
    state.step = newest;
    patchIfStale();
    analyze();
  }
  showSteps();
  return true;
}

// the page's loop: a run being trained shows up as it is written
async function followRun() {
  try {
    await loadTimeline();
  } catch (e) {
    // the server may be restarting, or the folder briefly unreadable: ask again at the next tick
  }
  if (!state.timeline || state.timeline.run) setTimeout(followRun, POLL_MS);
}

// ---------------------------------------------------------------------------
// Play: the steps one after another, each drawn before the next

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function play() {
  if (state.playing) {
    state.playing = false;
    showSteps();
    return;
  }
  state.playing = true;
  let k = state.steps.indexOf(shownStep());
  if (k >= state.steps.length - 1) k = -1; // at the end: from the first step again
  while (state.playing && k + 1 < state.steps.length) {
    k += 1;
    await stepTo(k);
    await sleep(PLAY_DWELL_MS);
  }
  state.playing = false;
  showSteps();
}

// ---------------------------------------------------------------------------
// Charts: lines against the step, on a canvas

// a colour per head: a hue per layer, lighter for later heads
function headColor(layer, head) {
  const { n_layer, n_head } = state.info;
  const hue = Math.round((360 * layer) / Math.max(1, n_layer));
  const light = n_head > 1 ? 30 + Math.round((35 * head) / (n_head - 1)) : 40;
  return `hsl(${hue}, 70%, ${light}%)`;
}

// about n round numbers from lo to hi
function ticks(lo, hi, n) {
  const span = hi - lo || 1;
  const raw = span / n;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push(v);
  return out;
}

function fmt(v) {
  if (Number.isInteger(v) || Math.abs(v) >= 100) return String(Math.round(v));
  return v.toPrecision(2);
}

// the plot's frame for a canvas and the ranges of x (steps) and y
function frame(canvas, x0, x1, y0, y1) {
  const w = canvas.width - CHART_LEFT - CHART_PAD;
  const h = canvas.height - 2 * CHART_PAD - 12;
  const dx = x1 - x0 || 1;
  const dy = y1 - y0 || 1;
  return {
    x: (v) => CHART_LEFT + ((v - x0) / dx) * w,
    y: (v) => CHART_PAD + (1 - (v - y0) / dy) * h,
    step: (px) => x0 + ((px - CHART_LEFT) / w) * dx,
    x0, x1, y0, y1, bottom: CHART_PAD + h,
  };
}

// series: [{points: [[step, value], ...], color, width, dash}]; marks: [{step, value, color,
// title}] drawn as triangles; rules: [{value, color}] drawn as dashed levels
function drawChart(canvas, series, marks = [], rules = []) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const points = series.flatMap((s) => s.points).concat(rules.map((r) => [null, r.value]));
  const steps = state.timeline.evaluations.map((e) => e.iter).concat(state.steps);
  if (!points.length || !steps.length) return null;
  const values = points.map((p) => p[1]);
  let y0 = Math.min(...values);
  let y1 = Math.max(...values);
  const margin = (y1 - y0) * 0.05 || Math.abs(y1) * 0.05 || 0.05;
  y0 -= margin;
  y1 += margin;
  const f = frame(canvas, Math.min(...steps), Math.max(...steps), y0, y1);
  ctx.font = "11px sans-serif";
  ctx.fillStyle = "#666";
  ctx.strokeStyle = "#e4e4e4";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of ticks(y0, y1, 4)) {
    ctx.beginPath();
    ctx.moveTo(CHART_LEFT, f.y(v));
    ctx.lineTo(canvas.width - CHART_PAD, f.y(v));
    ctx.stroke();
    ctx.fillText(fmt(v), CHART_LEFT - 4, f.y(v));
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const v of ticks(f.x0, f.x1, 8)) ctx.fillText(fmt(v), f.x(v), f.bottom + 3);
  for (const r of rules) {
    ctx.strokeStyle = r.color;
    ctx.setLineDash([4, 4]);
    ctx.beginPath();
    ctx.moveTo(CHART_LEFT, f.y(r.value));
    ctx.lineTo(canvas.width - CHART_PAD, f.y(r.value));
    ctx.stroke();
  }
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = s.width || 1.5;
    ctx.setLineDash(s.dash || []);
    ctx.beginPath();
    s.points.forEach(([x, y], i) => (i ? ctx.lineTo(f.x(x), f.y(y)) : ctx.moveTo(f.x(x), f.y(y))));
    ctx.stroke();
    if (s.points.length === 1) {
      ctx.fillStyle = s.color;
      ctx.fillRect(f.x(s.points[0][0]) - 2, f.y(s.points[0][1]) - 2, 4, 4);
    }
  }
  ctx.setLineDash([]);
  for (const m of marks) {
    const x = f.x(m.step);
    const y = f.y(m.value);
    ctx.fillStyle = m.color;
    ctx.beginPath();
    ctx.moveTo(x, y - 7);
    ctx.lineTo(x - 4, y - 1);
    ctx.lineTo(x + 4, y - 1);
    ctx.fill();
  }
  const step = shownStep();
  if (step !== null) {
    ctx.strokeStyle = "#e67e22";
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(f.x(step), CHART_PAD);
    ctx.lineTo(f.x(step), f.bottom);
    ctx.stroke();
  }
  return f;
}

// the points [step, value] of the evaluations that have the value
function pointsOf(evaluations, value) {
  return evaluations.filter((e) => value(e) !== undefined && value(e) !== null).map((e) => [e.iter, value(e)]);
}

// ---------------------------------------------------------------------------
// The timeline panel

function timelineSummary(t) {
  const ev = t.evaluations;
  if (!ev.length) return `No evaluation in the run's log yet; ${state.steps.length} step(s) on the slider.`;
  const last = ev[ev.length - 1];
  const parts = [`${ev.length} evaluation(s), iters ${ev[0].iter} to ${last.iter}`];
  if (last.val_loss !== undefined && last.val_loss !== null) parts.push(`val loss ${last.val_loss.toFixed(4)} at iter ${last.iter}`);
  if (last.icl_score !== undefined && last.icl_score !== null) parts.push(`in-context learning score ${last.icl_score.toFixed(3)}`);
  parts.push(`${state.steps.length} step(s) on the slider`);
  parts.push(`${t.label_changes.length} label change(s)`);
  if (t.skipped_lines) parts.push(`${t.skipped_lines} line(s) of the log not read (being written, or not JSON)`);
  return parts.join("; ") + ".";
}

function renderTimeline() {
  const t = state.timeline;
  $("view-timeline").hidden = !t || (!t.evaluations.length && !t.run);
  if (!t || !state.info) return;
  $("timeline-summary").textContent = timelineSummary(t);
  const ev = t.evaluations;
  const loss = [
    { points: pointsOf(ev, (e) => e.val_loss), color: "#2980b9", width: 2 },
    { points: pointsOf(ev, (e) => e.train_loss), color: "#7f8c8d", dash: [5, 4] },
  ];
  drawChart($("timeline-loss"), loss);
  const icl = pointsOf(ev, (e) => e.icl_score);
  $("timeline-icl-figure").hidden = !icl.length;
  if (icl.length) drawChart($("timeline-icl"), [{ points: icl, color: "#8e44ad", width: 2 }], [], [{ value: 0, color: "#999" }]);
  renderInduction(t);
  renderChanges(t);
}

// every head's induction score, the selected head drawn thick, the label changes as marks
function renderInduction(t) {
  const logged = t.evaluations.filter((e) => e.induction);
  $("timeline-induction-figure").hidden = !logged.length;
  $("timeline-legend").hidden = !logged.length;
  if (!logged.length) return;
  const { n_layer, n_head } = state.info;
  const series = [];
  const at = {}; // "iter,layer,head" -> the score, for the marks
  for (let l = 0; l < n_layer; l++) {
    for (let h = 0; h < n_head; h++) {
      const points = pointsOf(logged, (e) => e.induction[l] && e.induction[l][h]);
      points.forEach(([x, y]) => (at[`${x},${l},${h}`] = y));
      const selected = l === state.layer && h === state.head;
      series.push({ points, color: headColor(l, h), width: selected ? 3.5 : 1.2, selected });
    }
  }
  series.sort((a, b) => a.selected - b.selected); // the selected head on top
  const marks = t.label_changes
    .filter((c) => at[`${c.iter},${c.layer},${c.head}`] !== undefined)
    .map((c) => ({ step: c.iter, value: at[`${c.iter},${c.layer},${c.head}`], color: headColor(c.layer, c.head) }));
  const rules = [{ value: t.induction_threshold, color: "#c0392b" }];
  drawChart($("timeline-induction"), series, marks, rules);
  $("timeline-induction-caption").textContent =
    `each head's induction score (a line per head; L${state.layer} H${state.head} thick); dashed red: the threshold ${t.induction_threshold}; ` +
    "a triangle: the head's label changed at that evaluation";
  const legend = $("timeline-legend");
  legend.textContent = "";
  for (let l = 0; l < n_layer; l++) {
    for (let h = 0; h < n_head; h++) {
      const item = document.createElement("span");
      item.className = "swatch" + (l === state.layer && h === state.head ? " selected" : "");
      item.style.borderColor = headColor(l, h);
      item.textContent = `L${l} H${h}`;
      item.addEventListener("click", () => selectHead(l, h));
      legend.appendChild(item);
    }
  }
}

// the nearest stop of the slider to a step
function nearestStop(step) {
  let best = 0;
  state.steps.forEach((s, k) => {
    if (Math.abs(s - step) < Math.abs(state.steps[best] - step)) best = k;
  });
  return best;
}

function renderChanges(t) {
  const head = (text) => ({ text, head: true });
  const rows = [[head("iter"), head("head"), head("from"), head("to")]];
  t.label_changes.forEach((c, k) => {
    const go = () => {
      selectHead(c.layer, c.head);
      if (state.steps.length) stepTo(nearestStop(c.iter));
    };
    rows.push([
      { text: String(c.iter), id: `change-${k}`, click: go },
      { text: `L${c.layer} H${c.head}`, fill: headColor(c.layer, c.head).replace("hsl", "hsla").replace(")", ", 0.25)"), click: go },
      { text: c.from, click: go },
      { text: c.to, click: go },
    ]);
  });
  fillTable($("label-changes"), rows.length > 1 ? rows : []);
}

// a click on a chart: the nearest snapshot to the step under the mouse
function chartClick(event) {
  if (SNAPSHOT || !state.steps.length || !state.timeline) return;
  const canvas = event.currentTarget;
  const rect = canvas.getBoundingClientRect();
  const steps = state.timeline.evaluations.map((e) => e.iter).concat(state.steps);
  const f = frame(canvas, Math.min(...steps), Math.max(...steps), 0, 1);
  const px = ((event.clientX - rect.left) / rect.width) * canvas.width;
  state.playing = false;
  stepTo(nearestStop(f.step(px)));
}

document.querySelectorAll("canvas.chart").forEach((c) => c.addEventListener("click", chartClick));

// ---------------------------------------------------------------------------
// Composition: the selected head against every head of the other layers

async function loadComposition(step) {
  const body = step === null ? {} : { step };
  try {
    state.composition = await api("/api/composition", body);
  } catch (e) {
    $("status").textContent = e.message;
    return;
  }
  renderComposition();
}

// head (l, h)'s score with the selected head: it reads the selected head's output when
// l is later, it writes into the selected head's input when l is earlier; null in its layer
function compositionWith(scores, l, h) {
  if (l > state.layer) return scores[state.layer][state.head][l][h];
  if (l < state.layer) return scores[l][h][state.layer][state.head];
  return null;
}

function compositionRows(c, kind) {
  const { n_layer, n_head } = state.info;
  const scores = c[kind];
  const largest = Math.max(1e-9, ...scores.flat(3).filter((v) => v !== null));
  const head = (text) => ({ text, head: true });
  const rows = [[head(kind.toUpperCase()), ...[...Array(n_head).keys()].map((h) => head(`H${h}`))]];
  for (let l = 0; l < n_layer; l++) {
    const row = [head(`L${l}`)];
    for (let h = 0; h < n_head; h++) {
      const v = compositionWith(scores, l, h);
      const id = `comp-${kind}-${l}-${h}`;
      if (v === null || v === undefined) {
        row.push({ text: "\u00b7", id });
        continue;
      }
      const title = l > state.layer ? `L${state.layer} H${state.head} writes into L${l} H${h}'s ${kind.toUpperCase()}` : `L${l} H${h} writes into L${state.layer} H${state.head}'s ${kind.toUpperCase()}`;
      row.push({ text: v.toFixed(3), fill: `rgba(39, 174, 96, ${Math.min(1, v / largest)})`, id, title: `${title}: ${v.toFixed(4)}`, click: () => selectHead(l, h) });
    }
    rows.push(row);
  }
  return rows;
}

function renderComposition() {
  if (!state.info) return;
  const c = state.composition;
  if (!SNAPSHOT && (!c || c.step !== shownStep())) {
    if (state.compositionAsked !== shownStep()) {
      state.compositionAsked = shownStep();
      loadComposition(shownStep());
    }
  }
  if (!c) return;
  const box = $("composition");
  box.textContent = "";
  for (const kind of ["q", "k", "v"]) {
    const table = document.createElement("table");
    table.className = "cells";
    table.id = `composition-${kind}`;
    fillTable(table, compositionRows(c, kind));
    box.appendChild(table);
  }
}
