// The explorer page's panels of coloured cells: why this token (the direct
// logit attribution and the logit lens) and activation patching, and the
// exports (.html and .png). explorer.js holds the state and the heads view;
// the page loads this file after it.
"use strict";

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
  // from the server (the page's scripts joined into one), or, in an exported page,
  // from the page itself
  const scripts = document.querySelectorAll("script");
  const [css, js] = SNAPSHOT
    ? [document.querySelector("style").textContent, scripts[scripts.length - 1].textContent]
    : await Promise.all([
        fetch("explorer.css").then((x) => x.text()),
        Promise.all(PAGE_SCRIPTS.map((f) => fetch(f).then((x) => x.text()))).then((texts) => texts.join("\n")),
      ]);
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
    opened: state.opened,
    step: state.step,
    patch: state.patch,
    timeline: state.timeline,
    composition: state.composition,
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

