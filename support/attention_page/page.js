"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.tokens.length, nLayer = D.maps.length, nHead = D.maps[0].length;
const $ = id => document.getElementById(id);
// 64 tokens get 14-pixel cells, every one labelled; a longer text smaller cells
const cell = Math.max(1, Math.min(28, Math.floor(900 / T)));
const canvas = $("map"), ctx = canvas.getContext("2d");
const font = "11px monospace";
// every k-th token labels the axes, so that labels stay 12 pixels apart at any length
const every = Math.ceil(12 / cell);
const label = t => t.length > 8 ? t.slice(0, 7) + "…" : t;
ctx.font = font;
const margin = Math.ceil(Math.max(...D.tokens.map(t => ctx.measureText(label(t)).width))) + 8;
canvas.width = canvas.height = margin + cell * T;
let layer = 0, head = 0, query = T - 1, pinned = T - 1, weights = null;

// bytes hold round(255 * sqrt(w)) of the lower triangle, row by row
function decode(b64) {
  const s = atob(b64), w = new Float32Array(s.length);
  for (let i = 0; i < s.length; i++) { const v = s.charCodeAt(i) / 255; w[i] = v * v; }
  return w;
}
const w = (i, j) => j > i ? 0 : weights[i * (i + 1) / 2 + j];
function colour(x) {  // white to dark blue, on a square-root scale like the pictures
  const v = Math.sqrt(x);
  return `rgb(${Math.round(255 - 247 * v)},${Math.round(255 - 207 * v)},${Math.round(255 - 148 * v)})`;
}
const pos = i => D.first_position + i;
const quote = i => `${pos(i)} "${D.tokens[i]}"`;

function drawMap() {
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < T; i++)
    for (let j = 0; j < T; j++) {
      ctx.fillStyle = j > i ? "#f4f4f4" : colour(w(i, j));
      ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
    }
  ctx.font = font; ctx.textBaseline = "middle";
  for (let i = 0; i < T; i++) {
    // the query's own label is always drawn, in red, between the thinned ones
    if (i % every && i !== query) continue;
    ctx.fillStyle = i === query ? "#d33" : "#444";
    ctx.textAlign = "right";
    ctx.fillText(label(D.tokens[i]), margin - 4, margin + (i + 0.5) * cell);
    ctx.save();  // column labels read bottom to top
    ctx.translate(margin + (i + 0.5) * cell, margin - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(label(D.tokens[i]), 0, 0);
    ctx.restore();
  }
  ctx.strokeStyle = "#d33"; ctx.lineWidth = Math.min(2, cell / 2);
  ctx.strokeRect(margin, margin + query * cell, (query + 1) * cell, cell);
}

function showQuery() {
  $("qtitle").textContent = `token ${quote(query)} attends to:`;
  const keys = [...Array(query + 1).keys()].filter(j => w(query, j) >= 0.0005);
  keys.sort((a, b) => w(query, b) - w(query, a));
  $("top").replaceChildren(...keys.slice(0, 12).map(j => {
    const row = document.createElement("div"), bar = document.createElement("span");
    bar.className = "bar"; bar.style.width = Math.max(1, Math.round(140 * w(query, j))) + "px";
    row.append(w(query, j).toFixed(3), bar, quote(j));
    return row;
  }));
  document.querySelectorAll("#tokens span").forEach((el, j) => {
    const x = w(query, j);
    el.style.background = j <= query ? colour(x) : "";
    el.style.color = x > 0.3 ? "#fff" : "";
    el.className = j === query ? "query" : j > query ? "future" : "";
    el.lastChild.textContent = j <= query && x >= 0.01 ? x.toFixed(2).replace(/^0/, "") : "";
  });
  drawMap();
}

function select() {
  weights = decode(D.maps[layer][head]);
  $("heads").querySelectorAll("button").forEach((b, h) => { b.className = h === head ? "on" : ""; });
  showQuery();
}

function headButtons() {  // one button per head of this layer, named by its label
  $("heads").replaceChildren(...[...Array(nHead).keys()].map(h => {
    const s = D.stats.find(s => s.layer === layer && s.head === h);
    const b = document.createElement("button");
    b.textContent = s ? `${h}: ${s.label}` : String(h);
    if (s) b.title = `${s.concentration}, mean entropy ${s.entropy.toFixed(2)} nats; share (lift): ` +
      Object.entries(s.scores).map(([k, v]) =>
        `${k} ${v.toFixed(2)}` + (s.lift[k] === null ? "" : ` (${s.lift[k].toFixed(1)}x)`)).join(", ");
    b.onclick = () => { head = h; select(); };
    return b;
  }));
}

for (let l = 0; l < nLayer; l++) $("layer").add(new Option(String(l), String(l)));
$("layer").onchange = () => { layer = Number($("layer").value); headButtons(); select(); };

D.tokens.forEach((t, j) => {
  const el = document.createElement("span");
  el.append(t, document.createElement("small"));
  el.title = `position ${pos(j)}`;
  el.onmouseenter = () => { query = j; showQuery(); };
  el.onclick = () => { pinned = j; };
  $("tokens").append(el);
});
$("tokens").onmouseleave = () => { query = pinned; showQuery(); };

function cellAt(e) {
  const r = canvas.getBoundingClientRect();
  return [Math.floor((e.clientY - r.top - margin) / cell), Math.floor((e.clientX - r.left - margin) / cell)];
}
canvas.onmousemove = e => {
  const [i, j] = cellAt(e);
  if (i < 0 || j < 0 || i >= T || j >= T) return;
  $("hover").textContent = j > i ? `${pos(j)} comes after ${pos(i)}: masked` :
    `${quote(i)} -> ${quote(j)}: ${w(i, j).toFixed(3)}`;
};
canvas.onclick = e => {
  const [i] = cellAt(e);
  if (i >= 0 && i < T) { query = pinned = i; showQuery(); }
};

$("note").textContent = `${T} tokens (positions ${pos(0)}..${pos(T - 1)}` +
  (D.hidden > 0 ? `; they also attend to the ${D.hidden} tokens before, not shown here` : "") +
  `), ${nLayer} layers x ${nHead} heads. Each row of the map is a query token, each column a token ` +
  `it can attend to; darker is more weight (square-root scale). ` +
  (every > 1 ? `Every ${every}th token names the axes. ` : "") +
  `Hover or click a token or a row.`;
headButtons();
select();
