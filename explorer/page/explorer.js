// The explorer page: asks the server's JSON API and draws what the model did.
// Served by explorer/server.py; an exported .html carries this file and a
// snapshot of the answer (window.EXPLORER_SNAPSHOT) and runs without the server.
// Three views: the heads (maps, labels, switching heads off), why this token
// (direct logit attribution and the logit lens) and activation patching; a
// training run's snapshots give a step slider. The page's state lives in its
// address, so that a link or a reload reopens the same view.
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
  checkpoint: null, // ckpt.pt's iter: the model the explorer started with
  step: null, // the iter shown; null: ckpt.pt's
  patch: null, // the last /api/patch answer
  patchAsked: "", // the request that answer is for, as JSON
  patchSeq: 0, // the newest patching asked for
};
const VIEWS = ["heads", "why", "patch"];
const PATCH_INPUTS = ["clean", "corrupt", "target", "foil"];

// ---------------------------------------------------------------------------
// The API

async function api(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
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
    const response = await fetch("/api/generate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
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
  writeUrl();
}

// ---------------------------------------------------------------------------
// Tables of coloured cells: a panel is rows of cells {text, fill, title, id,
// col, head, click}, drawn as a <table> on the page and on a canvas in the .png

function fillTable(table, rows) {
  table.textContent = "";
  for (const row of rows) {
    const tr = document.createElement("tr");
    for (const cell of row) {
      const td = document.createElement(cell.head ? "th" : "td");
      td.textContent = cell.text;
      if (cell.fill) td.style.background = cell.fill;
      if (cell.title) td.title = cell.title;
      if (cell.id) td.id = cell.id;
      if (cell.cls) td.className = cell.cls;
      if (cell.col !== undefined) td.dataset.col = cell.col;
      if (cell.click) td.addEventListener("click", cell.click);
      tr.appendChild(td);
    }
    table.appendChild(tr);
  }
}

// cells of width pixels, the first column (the rows' names) 48; returns the height drawn
const NAME_WIDTH = 48;
function drawCells(ctx, rows, x, y, width, height) {
  ctx.font = "11px monospace";
  ctx.textBaseline = "middle";
  rows.forEach((row, i) =>
    row.forEach((cell, j) => {
      const left = j === 0 ? x : x + NAME_WIDTH + (j - 1) * width;
      const w = j === 0 ? NAME_WIDTH : width;
      if (cell.fill) {
        ctx.fillStyle = cell.fill;
        ctx.fillRect(left, y + i * height, w - 1, height - 1);
      }
      ctx.fillStyle = "#222";
      ctx.fillText(cell.text.slice(0, Math.floor(w / 7)), left + 2, y + i * height + height / 2);
    }),
  );
  return rows.length * height;
}

// blue for a push up, red for a push down, as strong as |v| is against scale
function signed(v, scale) {
  const a = Math.min(1, Math.abs(v) / Math.max(scale, 1e-9)) * 0.85;
  return v >= 0 ? `rgba(41, 128, 185, ${a})` : `rgba(192, 57, 43, ${a})`;
}

// ---------------------------------------------------------------------------
// Why this token: the direct logit attribution and the logit lens

// the token under the mouse (why it came, from the position before it), else the next token
function whyEntry(r) {
  const i = state.hover;
  if (i !== null && i !== undefined && i >= 1 && i <= r.token_attribution.length) return r.token_attribution[i - 1];
  return r.attribution;
}

function attributionRows(r, a) {
  const { n_layer, n_head } = state.info;
  const values = [a.embed, a.bias, ...a.mlp, ...a.heads.flat()];
  const scale = Math.max(...values.map(Math.abs));
  const head = (text) => ({ text, head: true });
  const rows = [[head(""), ...[...Array(n_head).keys()].map((h) => head(`H${h}`)), head("MLP")]];
  for (let l = 0; l < n_layer; l++) {
    const row = [head(`L${l}`)];
    for (let h = 0; h < n_head; h++) {
      const v = a.heads[l][h];
      const label = r.labels[l][h].label;
      const selected = l === state.layer && h === state.head ? "selected" : "";
      row.push({ text: v.toFixed(2), fill: signed(v, scale), id: `attr-${l}-${h}`, cls: selected, title: `L${l} H${h} (${label}): ${v.toFixed(4)}`, click: () => selectHead(l, h) });
    }
    row.push({ text: a.mlp[l].toFixed(2), fill: signed(a.mlp[l], scale), id: `attr-mlp-${l}`, title: `MLP of layer ${l}: ${a.mlp[l].toFixed(4)}` });
    rows.push(row);
  }
  const sum = a.embed + a.bias + a.mlp.reduce((x, y) => x + y, 0) + a.heads.flat().reduce((x, y) => x + y, 0);
  rows.push([
    head("embed"),
    { text: a.embed.toFixed(2), fill: signed(a.embed, scale), id: "attr-embed", title: `the token and position embeddings: ${a.embed.toFixed(4)}` },
    head("bias"),
    { text: a.bias.toFixed(2), fill: signed(a.bias, scale), id: "attr-bias", title: `attention output biases and ln_f's bias: ${a.bias.toFixed(4)}` },
    head("sum"),
    { text: sum.toFixed(2), id: "attr-sum", title: `the parts add up to the logit ${a.logit.toFixed(4)}` },
  ]);
  return rows;
}

function whyTitle(r, a) {
  const which = a === r.attribution && a.position === r.tokens.length - 1 ? "the next token" : `token ${a.position + 1}`;
  return `Why "${shown(a.token)}" (${which}) after "${shown(r.tokens[a.position])}": logit ${a.logit.toFixed(3)}`;
}

function renderWhy(r) {
  const a = whyEntry(r);
  $("why-title").textContent = whyTitle(r, a);
  fillTable($("attribution"), attributionRows(r, a));
}

function lensRows(r, first) {
  const head = (text) => ({ text, head: true });
  const columns = r.tokens.slice(first);
  const rows = [[head(""), ...columns.map((t, k) => ({ text: shown(t), head: true, col: first + k }))]];
  r.logit_lens.forEach((point, k) => {
    const name = k === 0 ? "embed" : `L${k - 1}`;
    const row = [head(name)];
    point.slice(first).forEach((cells, j) => {
      const top = cells.map((c) => `${shown(c.token)} ${c.prob.toFixed(3)}`).join(", ");
      row.push({ text: shown(cells[0].token), fill: `rgba(39, 174, 96, ${cells[0].prob})`, col: first + j, title: `${name}, position ${first + j}: ${top}` });
    });
    rows.push(row);
  });
  return rows;
}

function renderLens(r) {
  fillTable($("lens"), lensRows(r, 0));
  document.querySelectorAll("#lens [data-col]").forEach((c) => c.classList.toggle("hover", Number(c.dataset.col) === state.hover));
}

// ---------------------------------------------------------------------------
// Activation patching

function patchBody() {
  const body = { clean: $("clean").value, corrupt: $("corrupt").value, target: $("target").value, foil: $("foil").value, ablate: ablateList() };
  return withStep(body);
}

async function runPatch() {
  if (SNAPSHOT) return;
  const seq = ++state.patchSeq;
  const body = patchBody();
  const asked = JSON.stringify(body);
  try {
    const answer = await api("/api/patch", body);
    if (seq !== state.patchSeq) return;
    state.patch = answer;
    state.patchAsked = asked;
    $("status").textContent = "";
  } catch (e) {
    if (seq !== state.patchSeq) return;
    state.patch = null;
    state.patchAsked = "";
    $("status").textContent = e.message;
  }
  renderPatch();
  writeUrl();
}

// the answer shown is for other heads off, another step or other prompts: ask again
function patchIfStale() {
  if (state.view === "patch" && JSON.stringify(patchBody()) !== state.patchAsked) runPatch();
}

function patchRows(p) {
  const head = (text) => ({ text, head: true });
  const n_head = p.heads[0].length;
  const rows = [[head(""), ...[...Array(n_head).keys()].map((h) => head(`H${h}`))]];
  p.heads.forEach((values, l) => {
    const row = [head(`L${l}`)];
    values.forEach((v, h) => {
      row.push({ text: v.toFixed(2), fill: signed(v, 1), id: `patch-${l}-${h}`, title: `L${l} H${h}: restores ${(100 * v).toFixed(1)}% (diff ${p.patched[l][h].toFixed(3)})`, click: () => selectHead(l, h) });
    });
    rows.push(row);
  });
  return rows;
}

function patchSummary(p) {
  const diff = `logit["${shown(p.target.token)}"] - logit["${shown(p.foil.token)}"]`;
  return `${diff}: clean ${p.clean_diff.toFixed(3)}, corrupt ${p.corrupt_diff.toFixed(3)}; each head: the share of the difference it restores`;
}

function renderPatch() {
  const p = state.patch;
  $("patch-summary").textContent = p ? patchSummary(p) : "";
  fillTable($("patch-grid"), p ? patchRows(p) : []);
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

async function loadSteps() {
  const answer = await (await fetch("/api/steps")).json();
  const stops = new Set(answer.steps);
  if (answer.checkpoint !== null) stops.add(answer.checkpoint);
  state.steps = [...stops].sort((a, b) => a - b);
  state.checkpoint = answer.checkpoint;
}

function showSteps() {
  $("steps").hidden = state.steps.length < 2;
  $("step").max = Math.max(0, state.steps.length - 1);
  const shownStep = state.step === null ? state.checkpoint : state.step;
  $("step").value = Math.max(0, state.steps.indexOf(shownStep));
  const where = shownStep === state.checkpoint ? "ckpt.pt" : "snapshot";
  $("step-label").textContent = shownStep === null ? "" : `iter ${shownStep} (${where})`;
}

function stepTo(k) {
  state.step = state.steps[k];
  showSteps();
  analyze();
  patchIfStale();
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
// Export: a self-contained .html (this page, its script and the answer) and a .png

function download(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
}

async function exportHtml() {
  // from the server, or, in an exported page, from the page itself
  const scripts = document.querySelectorAll("script");
  const [css, js] = SNAPSHOT
    ? [document.querySelector("style").textContent, scripts[scripts.length - 1].textContent]
    : await Promise.all(["explorer.css", "explorer.js"].map((f) => fetch(f).then((x) => x.text())));
  const snap = {
    info: state.info,
    result: state.result,
    layer: state.layer,
    head: state.head,
    ablate: [...state.ablate],
    generated: state.generated,
    prompt: $("prompt").value,
    hover: state.hover,
    view: state.view,
    steps: state.steps,
    checkpoint: state.checkpoint,
    step: state.step,
    patch: state.patch,
    patchInputs: PATCH_INPUTS.map((id) => $(id).value),
  };
  // "<" escaped: no "</script>" inside the data can end the script early
  const data = JSON.stringify(snap).replace(/</g, "\\u003c");
  const html = [
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Attention explorer</title>',
    `<style>${css}</style></head><body>${BODY.replace(/<script[^>]*><\/script>/g, "")}`,
    `<script>window.EXPLORER_SNAPSHOT = ${data};</script>`,
    `<script>${js.replace(/<\/script/gi, "<\\/script")}</script></body></html>`,
  ].join("\n");
  download("attention.html", new Blob([html], { type: "text/html" }));
}

// the .png: the head's map, the layer's heads, the probabilities and continuations,
// then why the token came (attribution), the logit lens and the patching answer
const LENS_PNG_POSITIONS = 48; // the lens's last positions drawn in the .png
function exportPng() {
  const r = state.result;
  const multiples = [...document.querySelectorAll("#multiples canvas")];
  const a = whyEntry(r);
  const why = attributionRows(r, a);
  const first = Math.max(0, r.tokens.length - LENS_PNG_POSITIONS);
  const lens = lensRows(r, first);
  const patch = state.patch ? patchRows(state.patch) : [];
  const canvas = document.createElement("canvas");
  const base = 340 + 128 * Math.floor((multiples.length - 1) / 5);
  canvas.width = Math.max(1000, 20 + NAME_WIDTH + 18 * lens[0].length, 20 + NAME_WIDTH + 44 * why[0].length);
  canvas.height = base + 18 * why.length + 16 * lens.length + 18 * patch.length + 110;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#222";
  ctx.font = "14px sans-serif";
  ctx.fillText($("head-label").textContent.slice(0, 130), 10, 20);
  ctx.drawImage($("heatmap"), 10, 40);
  multiples.forEach((c, h) => ctx.drawImage(c, 310 + (h % 5) * 128, 40 + Math.floor(h / 5) * 128));
  const columns = r.intact ? [["heads off", r], ["intact", r.intact]] : [["intact", r]];
  const top = 60 + 128 * Math.ceil(multiples.length / 5);
  ctx.font = "12px monospace";
  columns.forEach(([title, a], k) => {
    const x = 310 + 330 * k;
    ctx.fillText(`${title}: next token, then greedy "${shown(a.continuation.join("")).slice(0, 24)}"`, x, top);
    a.next.forEach((n, i) => ctx.fillText(`${shown(n.token).padEnd(8)} ${n.prob.toFixed(4)}`, x, top + 16 + 12 * i));
  });
  let y = base;
  const heading = (text) => {
    ctx.font = "13px sans-serif";
    ctx.fillStyle = "#222";
    ctx.textBaseline = "alphabetic";
    ctx.fillText(text, 10, y + 14);
    y += 22;
  };
  heading(`${whyTitle(r, a)} (direct logit attribution; blue up, red down)`);
  y += drawCells(ctx, why, 10, y, 44, 18) + 8;
  heading(`Logit lens: top token after the embeddings and each block${first ? `, the last ${LENS_PNG_POSITIONS} positions` : ""}`);
  y += drawCells(ctx, lens, 10, y, 18, 16) + 8;
  if (state.patch) {
    heading(`Patching "${shown(state.patch.clean.join(""))}" into "${shown(state.patch.corrupt.join(""))}": ${patchSummary(state.patch)}`);
    drawCells(ctx, patch, 10, y, 44, 18);
  }
  canvas.toBlob((blob) => download("attention.png", blob), "image/png");
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
    state.step = SNAPSHOT.step;
    state.patch = SNAPSHOT.patch;
    PATCH_INPUTS.forEach((id, k) => {
      $(id).value = SNAPSHOT.patchInputs[k];
      $(id).readOnly = true;
    });
    $("prompt").value = SNAPSHOT.prompt;
    $("prompt").readOnly = true;
    $("generate-bar").hidden = true;
    $("patch").hidden = true;
    $("step").disabled = true;
  } else {
    const response = await fetch("/api/info");
    state.info = await response.json();
    await loadSteps();
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
  $("step").addEventListener("input", (e) => stepTo(Number(e.target.value)));
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
}

start();
