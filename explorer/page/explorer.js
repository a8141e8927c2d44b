// The explorer page: asks the server's JSON API and draws what the model did.
// Served by explorer/server.py; an exported .html carries this file (with
// panels.js and timeline.js) and a snapshot of the answer
// (window.EXPLORER_SNAPSHOT) and runs without the server. Four views: the heads
// (maps, labels, switching heads off, composition), why this token (direct logit
// attribution and the logit lens), activation patching and a training run's
// timeline; a run's snapshots give a step slider. This file holds the state,
// the heads view, the slider and the address; panels.js the panels of cells
// and the exports; timeline.js the run followed live and the composition. The
// page's state lives in its address, so that a link or a reload reopens the
// same view.
"use strict";

const $ = (id) => document.getElementById(id);
const SNAPSHOT = window.EXPLORER_SNAPSHOT || null;
const BODY = document.body.innerHTML; // the page before drawing: what an export starts from
const state = {
  info: null,
  layer: 0,
  head: 0,
  ablate: new Set(), // "layer,head" keys
  result: null, // the last /api/analyze answer
  hover: null, // the query token under the mouse
  generated: 0, // how many of the shown tokens were generated
  seq: 0, // the newest analysis asked for: older answers are dropped
  busy: false,
  controller: null, // aborts a running generation
  view: "heads", // the panels shown: one of VIEWS
  steps: [], // the iters of the run's snapshots and of ckpt.pt: the slider's stops
  checkpoint: null, // the iter of the model the explorer started with
  opened: "ckpt.pt", // where that model came from: ckpt.pt, or a snapshot
  step: null, // the iter shown; null: the model the explorer started with
  timeline: null, // the last /api/timeline answer: the run's evaluations
  playing: false, // the steps are being played through
  composition: null, // the last /api/composition answer
  compositionAsked: undefined, // the step of the composition asked for last
  patch: null, // the last /api/patch answer
  patchAsked: "", // the request that answer is for, as JSON
  patchSeq: 0, // the newest patching asked for
};
const VIEWS = ["heads", "why", "patch", "timeline"];
const PAGE_SCRIPTS = ["explorer.js", "panels.js", "timeline.js"]; // in the order the page loads them
const PATCH_INPUTS = ["clean", "corrupt", "target", "foil"];

// ---------------------------------------------------------------------------
// The API

// A POST to the server. Where no answer comes (explore.py stopped, or the network
// gone), the browser's own words ("Failed to fetch") would not say which side failed.
async function post(path, body, signal) {
  try {
    return await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new Error("no answer from explore.py: is it still running? Start it again, then reload this page");
  }
}

async function api(path, body) {
  const response = await post(path, body);
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error);
  return answer;
}

function ablateList() {
  return [...state.ablate].map((k) => k.split(",").map(Number));
}

// the step goes with every question once the slider has moved
function withStep(body) {
  if (state.step !== null) body.step = state.step;
  return body;
}

async function analyze() {
  const seq = ++state.seq;
  const prompt = $("prompt").value;
  if (!prompt) return;
  state.busy = true;
  try {
    const result = await api("/api/analyze", withStep({ prompt, ablate: ablateList() }));
    if (seq !== state.seq) return;
    state.result = result;
    $("status").textContent = "";
    render();
  } catch (e) {
    if (seq === state.seq) $("status").textContent = e.message;
  } finally {
    state.busy = false;
  }
}

let timer = null;
function analyzeSoon() {
  clearTimeout(timer);
  timer = setTimeout(analyze, 250);
}

// Sampled tokens arrive one JSON line at a time; the maps are analysed again
// whenever the last analysis has come back, so they grow with the text.
async function generate() {
  const start = $("prompt").value;
  const body = withStep({
    prompt: start,
    ablate: ablateList(),
    temperature: Number($("temperature").value),
    top_k: Number($("top-k").value),
    max_new_tokens: Number($("length").value),
    seed: Number($("seed").value),
  });
  state.controller = new AbortController();
  $("generate").disabled = true;
  $("stop").disabled = false;
  $("status").textContent = "";
  let tokens = [];
  let generated = 0;
  try {
    const response = await post("/api/generate", body, state.controller.signal);
    if (!response.ok) throw new Error((await response.json()).error);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const line of lines) {
        const msg = JSON.parse(line);
        if (msg.error) throw new Error(msg.error);
        if (msg.prompt_tokens) tokens = msg.prompt_tokens.slice();
        if (msg.token !== undefined) {
          tokens.push(msg.token);
          generated += 1;
        }
      }
      showGrowing(tokens, generated);
    }
  } catch (e) {
    if (e.name !== "AbortError") $("status").textContent = e.message;
  } finally {
    await showGrowing(tokens, generated, true);
    $("generate").disabled = false;
    $("stop").disabled = true;
  }
}

function showGrowing(tokens, generated, last) {
  const context = state.info.context;
  const kept = tokens.slice(-context);
  $("prompt").value = kept.join("");
  state.generated = Math.min(generated, kept.length);
  if (last || !state.busy) return analyze();
}

// ---------------------------------------------------------------------------
// Drawing

function shown(token) {
  return token.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
}

function headInfo(result, layer, head) {
  return result.labels[layer][head];
}

function render() {
  const r = state.result;
  if (!r) return;
  renderTokens(r);
  renderHead(r);
  renderMultiples(r);
  renderGrid(r);
  renderCompare(r);
  renderWhy(r);
  renderLens(r);
  renderComposition();
  writeUrl();
}

function renderTokens(r) {
  const box = $("tokens");
  box.textContent = "";
  const maxLoss = Math.max(1e-9, ...r.token_loss);
  const T = r.tokens.length;
  r.tokens.forEach((t, i) => {
    const span = document.createElement("span");
    span.className = "tok" + (i >= T - state.generated ? " new" : "") + (i === state.hover ? " hover" : "");
    span.textContent = shown(t);
    if (i > 0) {
      const loss = r.token_loss[i - 1];
      span.title = `token ${i}: loss ${loss.toFixed(3)} nats`;
      span.style.background = `rgba(231, 76, 60, ${(0.6 * loss) / maxLoss})`;
    }
    span.addEventListener("mouseenter", () => setHover(i));
    box.appendChild(span);
  });
}

function setHover(i) {
  if (state.hover === i) return;
  state.hover = i;
  const r = state.result;
  document.querySelectorAll("#tokens .tok").forEach((s, j) => s.classList.toggle("hover", j === i));
  drawHeatmap($("heatmap"), r.attention[state.layer][state.head], i);
  drawLines($("lines"), r, i);
  renderWhy(r);
  document.querySelectorAll("#lens [data-col]").forEach((c) => c.classList.toggle("hover", Number(c.dataset.col) === i));
}

function color(w) {
  const v = Math.sqrt(Math.max(0, w));
  return `rgb(${Math.round(255 - 219 * v)}, ${Math.round(255 - 196 * v)}, ${Math.round(255 - 120 * v)})`;
}

function drawHeatmap(canvas, map, hover) {
  const ctx = canvas.getContext("2d");
  const T = map.length;
  const cell = canvas.width / T;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < T; i++) {
    for (let j = 0; j <= i; j++) {
      ctx.fillStyle = color(map[i][j]);
      ctx.fillRect(j * cell, i * cell, Math.ceil(cell), Math.ceil(cell));
    }
  }
  if (hover !== null && hover !== undefined && hover < T) {
    ctx.strokeStyle = "#e67e22";
    ctx.lineWidth = 2;
    ctx.strokeRect(0, hover * cell, (hover + 1) * cell, cell);
  }
}

// bertviz's line view: queries on the left, keys on the right, a line for
// each weight, as opaque as the weight is large
function drawLines(canvas, r, hover) {
  const map = r.attention[state.layer][state.head];
  const T = r.tokens.length;
  const rowH = lineHeight(T);
  canvas.height = Math.max(60, T * rowH + 8);
  const ctx = canvas.getContext("2d");
  const left = 70;
  const right = canvas.width - 70;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = `${Math.min(11, rowH)}px monospace`;
  ctx.textBaseline = "middle";
  for (let i = 0; i < T; i++) {
    const y = 4 + i * rowH + rowH / 2;
    const label = shown(r.tokens[i]).slice(0, 10);
    ctx.fillStyle = i === hover ? "#e67e22" : "#333";
    ctx.textAlign = "right";
    ctx.fillText(label, left - 6, y);
    ctx.textAlign = "left";
    ctx.fillStyle = "#333";
    ctx.fillText(label, right + 6, y);
  }
  const queries = hover === null || hover === undefined ? [...Array(T).keys()] : [hover];
  const scale = queries.length > 1 ? 0.5 : 1;
  for (const i of queries) {
    for (let j = 0; j <= i; j++) {
      const w = map[i][j];
      if (w < 0.01) continue;
      ctx.strokeStyle = `rgba(41, 128, 185, ${Math.min(1, w * scale)})`;
      ctx.lineWidth = 1 + 3 * w;
      ctx.beginPath();
      ctx.moveTo(left, 4 + i * rowH + rowH / 2);
      ctx.lineTo(right, 4 + j * rowH + rowH / 2);
      ctx.stroke();
    }
  }
}

// rows of 8 to 14 pixels: a 64-token prompt fits the box without scrolling
function lineHeight(T) {
  return Math.max(8, Math.min(14, 560 / T));
}

function linesHover(event) {
  const rect = $("lines").getBoundingClientRect();
  const i = Math.floor((event.clientY - rect.top - 4) / lineHeight(state.result.tokens.length));
  if (state.result && i >= 0 && i < state.result.tokens.length) setHover(i);
}

// a row of the heatmap is a query: the mouse over it picks that token
function heatmapHover(event) {
  const rect = $("heatmap").getBoundingClientRect();
  const T = state.result ? state.result.tokens.length : 0;
  const i = Math.floor(((event.clientY - rect.top) / rect.height) * T);
  if (i >= 0 && i < T) setHover(i);
}

function labelText(h) {
  return h.label === "induction" ? `induction (${h.induction.toFixed(2)}); pattern ${h.pattern}` : h.label;
}

function renderHead(r) {
  const h = headInfo(r, state.layer, state.head);
  const shares = Object.entries(h.scores).map(([c, v]) => `${c} ${(100 * v).toFixed(0)}%`).join(", ");
  const off = state.ablate.has(`${state.layer},${state.head}`) ? " [switched off]" : "";
  $("head-label").textContent = `L${state.layer} H${state.head}: ${labelText(h)}${off} (${h.concentration}; ${shares})`;
  drawHeatmap($("heatmap"), r.attention[state.layer][state.head], state.hover);
  drawLines($("lines"), r, state.hover);
}

function renderMultiples(r) {
  const box = $("multiples");
  box.textContent = "";
  r.attention[state.layer].forEach((map, h) => {
    const div = document.createElement("div");
    const off = state.ablate.has(`${state.layer},${h}`);
    div.className = "multiple" + (h === state.head ? " selected" : "") + (off ? " off" : "");
    div.dataset.head = h;
    const canvas = document.createElement("canvas");
    canvas.width = 120;
    canvas.height = 120;
    drawHeatmap(canvas, map, null);
    const caption = document.createElement("div");
    caption.textContent = `H${h}: ${headInfo(r, state.layer, h).label}`;
    div.append(canvas, caption);
    div.addEventListener("click", () => selectHead(state.layer, h));
    box.appendChild(div);
  });
}

function renderGrid(r) {
  const grid = $("grid");
  const { n_layer, n_head } = state.info;
  grid.textContent = "";
  grid.style.gridTemplateColumns = `40px repeat(${n_head}, 1fr)`;
  for (let l = 0; l < n_layer; l++) {
    const rowHead = document.createElement("span");
    rowHead.className = "rowhead";
    rowHead.textContent = `L${l}`;
    grid.appendChild(rowHead);
    for (let h = 0; h < n_head; h++) {
      const button = document.createElement("button");
      const key = `${l},${h}`;
      button.className = state.ablate.has(key) ? "off" : "";
      button.id = `ablate-${l}-${h}`;
      button.textContent = `H${h} ${headInfo(r, l, h).label}`;
      button.title = "click to switch this head off or on";
      button.addEventListener("click", () => toggle(l, h));
      grid.appendChild(button);
    }
  }
}

function toggle(layer, head) {
  if (SNAPSHOT) return;
  const key = `${layer},${head}`;
  if (state.ablate.has(key)) state.ablate.delete(key);
  else state.ablate.add(key);
  analyze();
}

function column(title, r, cls) {
  const div = document.createElement("div");
  div.className = "column " + cls;
  const h3 = document.createElement("h3");
  const loss = r.loss === null ? "" : `, mean loss ${r.loss.toFixed(3)}`;
  h3.textContent = title + loss;
  div.appendChild(h3);
  const top = r.next[0].prob;
  for (const n of r.next) {
    const bar = document.createElement("div");
    bar.className = "bar";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = shown(n.token);
    name.title = shown(n.token); // a token wider than its column ends in an ellipsis
    const track = document.createElement("span");
    track.className = "track";
    const fill = document.createElement("span");
    fill.className = "fill";
    fill.style.display = "block";
    fill.style.width = `${(100 * n.prob) / Math.max(top, 1e-9)}%`;
    track.appendChild(fill);
    const p = document.createElement("span");
    p.className = "p";
    p.textContent = n.prob.toFixed(4);
    bar.append(name, track, p);
    div.appendChild(bar);
  }
  const canvas = document.createElement("canvas");
  canvas.className = "loss";
  canvas.width = 300;
  canvas.height = 70;
  drawLoss(canvas, r.token_loss, cls === "ablated" ? "#c0392b" : "#2980b9");
  const caption = document.createElement("div");
  caption.className = "note";
  caption.textContent = "loss of each prompt token (nats, 0 to 8)";
  const text = document.createElement("div");
  text.className = "continuation";
  text.textContent = r.continuation.join("");
  const textCaption = document.createElement("div");
  textCaption.className = "note";
  textCaption.textContent = "greedy continuation";
  div.append(canvas, caption, textCaption, text);
  return div;
}

function drawLoss(canvas, losses, fill) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width / Math.max(1, losses.length);
  ctx.fillStyle = fill;
  losses.forEach((loss, i) => {
    const h = (Math.min(loss, 8) / 8) * canvas.height;
    ctx.fillRect(i * w, canvas.height - h, Math.max(1, w - 1), h);
  });
}

function renderCompare(r) {
  const box = $("compare");
  box.textContent = "";
  if (r.intact) {
    box.appendChild(column(`${r.ablate.length} head(s) off`, r, "ablated"));
    box.appendChild(column("intact", r.intact, "intact"));
  } else {
    box.appendChild(column("intact (switch heads off to compare)", r, "intact"));
  }
}

function selectHead(layer, head) {
  state.layer = layer;
  state.head = head;
  $("layer").value = layer;
  $("head").value = head;
  if (state.result) {
    renderHead(state.result);
    renderMultiples(state.result);
    renderWhy(state.result);
  }
  renderComposition();
  renderTimeline();
  writeUrl();
}

// ---------------------------------------------------------------------------
// Views, the step slider and the address

function showView(view) {
  state.view = view;
  document.querySelectorAll("section[data-view]").forEach((s) => {
    s.hidden = s.dataset.view !== view;
  });
  VIEWS.forEach((v) => $(`view-${v}`).classList.toggle("selected", v === view));
  if (!SNAPSHOT) patchIfStale();
  writeUrl();
}

// the slider's stops from an /api/timeline answer: the snapshots and
// the model the explorer started with
function setSteps(answer) {
  const stops = new Set(answer.steps);
  if (answer.checkpoint !== null) stops.add(answer.checkpoint);
  state.steps = [...stops].sort((a, b) => a - b);
  state.checkpoint = answer.checkpoint;
  state.opened = answer.opened;
}

// the iter shown: the step asked for, or the model the explorer started with
function shownStep() {
  return state.step === null ? state.checkpoint : state.step;
}

function showSteps() {
  $("steps").hidden = state.steps.length < 2;
  $("step").max = Math.max(0, state.steps.length - 1);
  const step = shownStep();
  $("step").value = Math.max(0, state.steps.indexOf(step));
  const where = step === state.checkpoint ? state.opened : "snapshot";
  $("step-label").textContent = step === null ? "" : `iter ${step} (${where})`;
  $("play").textContent = state.playing ? "Pause" : "Play";
  renderTimeline();
}

// the k-th stop of the slider; resolves when its analysis has come back
function stepTo(k) {
  state.step = state.steps[k];
  showSteps();
  patchIfStale();
  return analyze();
}

// ?prompt=...&layer=1&head=2&off=0.1,1.3&step=400&view=why (and the patching inputs)
function writeUrl() {
  if (SNAPSHOT) return;
  const q = new URLSearchParams();
  q.set("prompt", $("prompt").value);
  q.set("layer", state.layer);
  q.set("head", state.head);
  if (state.ablate.size) q.set("off", [...state.ablate].map((k) => k.replace(",", ".")).join(","));
  if (state.step !== null) q.set("step", state.step);
  q.set("view", state.view);
  if (state.view === "patch") PATCH_INPUTS.forEach((id) => q.set(id, $(id).value));
  history.replaceState(null, "", `?${q}`);
}

// a number from the address, if it is an integer in 0 .. n - 1
function index(q, key, n) {
  const v = Number(q.get(key));
  return q.has(key) && Number.isInteger(v) && v >= 0 && v < n ? v : null;
}

function readUrl() {
  const q = new URLSearchParams(location.search);
  const { n_layer, n_head } = state.info;
  if (q.has("prompt")) $("prompt").value = q.get("prompt");
  state.layer = index(q, "layer", n_layer) ?? 0;
  state.head = index(q, "head", n_head) ?? 0;
  for (const pair of (q.get("off") || "").split(",")) {
    const [l, h] = pair.split(".").map(Number);
    if (Number.isInteger(l) && Number.isInteger(h) && l >= 0 && l < n_layer && h >= 0 && h < n_head) state.ablate.add(`${l},${h}`);
  }
  const step = Number(q.get("step"));
  if (q.has("step") && state.steps.includes(step)) state.step = step;
  if (VIEWS.includes(q.get("view"))) state.view = q.get("view");
  PATCH_INPUTS.forEach((id) => {
    if (q.has(id)) $(id).value = q.get(id);
  });
}

// ---------------------------------------------------------------------------
// Start

function fillSelect(select, n, prefix) {
  select.textContent = "";
  for (let i = 0; i < n; i++) {
    const option = document.createElement("option");
    option.value = i;
    option.textContent = `${prefix}${i}`;
    select.appendChild(option);
  }
}

async function start() {
  if (SNAPSHOT) {
    state.info = SNAPSHOT.info;
    state.result = SNAPSHOT.result;
    state.ablate = new Set(SNAPSHOT.ablate);
    state.generated = SNAPSHOT.generated;
    state.hover = SNAPSHOT.hover;
    state.view = SNAPSHOT.view;
    state.steps = SNAPSHOT.steps;
    state.checkpoint = SNAPSHOT.checkpoint;
    state.opened = SNAPSHOT.opened;
    state.step = SNAPSHOT.step;
    state.patch = SNAPSHOT.patch;
    state.timeline = SNAPSHOT.timeline;
    state.composition = SNAPSHOT.composition;
    PATCH_INPUTS.forEach((id, k) => {
      $(id).value = SNAPSHOT.patchInputs[k];
      $(id).readOnly = true;
    });
    $("prompt").value = SNAPSHOT.prompt;
    $("prompt").readOnly = true;
    $("generate-bar").hidden = true;
    $("patch").hidden = true;
    $("step").disabled = true;
    $("play").hidden = true;
  } else {
    const response = await fetch("/api/info");
    state.info = await response.json();
    try {
      await loadTimeline();
    } catch (e) {
      $("status").textContent = e.message;
    }
  }
  const info = state.info;
  $("model").textContent = `${info.n_layer} layers x ${info.n_head} heads, context ${info.context}, ${info.tokenizer} tokens, ${info.dtype}`;
  $("rule").textContent = `Labels: a head is "induction" when its induction-probe score is >= ${info.induction_threshold}; else ${info.label_rule}.`;
  fillSelect($("layer"), info.n_layer, "L");
  fillSelect($("head"), info.n_head, "H");
  $("layer").addEventListener("change", (e) => selectHead(Number(e.target.value), state.head));
  $("head").addEventListener("change", (e) => selectHead(state.layer, Number(e.target.value)));
  $("lines").addEventListener("mousemove", linesHover);
  $("heatmap").addEventListener("mousemove", heatmapHover);
  $("export-html").addEventListener("click", exportHtml);
  $("export-png").addEventListener("click", exportPng);
  VIEWS.forEach((v) => $(`view-${v}`).addEventListener("click", () => showView(v)));
  if (SNAPSHOT) {
    selectHead(SNAPSHOT.layer, SNAPSHOT.head);
    render();
    renderPatch();
    showSteps();
    showView(state.view);
    return;
  }
  // the example prompt, cut to fit a small model's context (no more tokens than characters)
  $("prompt").value = $("prompt").value.slice(0, info.context);
  readUrl();
  selectHead(state.layer, state.head);
  showSteps();
  $("step").addEventListener("input", (e) => {
    state.playing = false;
    stepTo(Number(e.target.value));
  });
  $("play").addEventListener("click", play);
  $("patch").addEventListener("click", runPatch);
  $("prompt").addEventListener("input", () => {
    state.generated = 0;
    analyzeSoon();
  });
  $("clear").addEventListener("click", () => {
    state.ablate.clear();
    analyze();
  });
  $("generate").addEventListener("click", generate);
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  analyze();
  showView(state.view);
  followRun();
}

// after panels.js and timeline.js have loaded
document.addEventListener("DOMContentLoaded", start);
