"""
Attention maps: what each head looked at while the model generated a sample.

generate_stream(..., return_attention=True) yields, for every new token, the
attention weights of the forward that produced it: the prompt's prefill gives
full (n_head, T, T) maps, each cached decode step adds one (n_head, 1, Tk) row.
assemble() stitches these steps back into one (n_head, T, T) map per layer, and
write_all() saves them in four forms:

  attention.npz   layer_0, layer_1, ...: float32 (n_head, T, T); tokens: the T
                  token strings; token_ids and window_start: which tokens these
                  are, so the maps can be recomputed with one forward
  layer_N.png     one picture per layer, a grid of its heads' heatmaps
  index.html      a self-contained viewer: pick a layer and head, hover a token
  heads.json      per head: mean entropy and the pattern it follows (head_stats)

Only numpy is needed here; matplotlib is imported when the pictures are drawn.
"""

import base64
import json
import math
import os

import numpy as np

PATTERNS = ("previous", "self", "first", "broad")
LABEL_MAX_TOKENS = 48  # above this, token labels on the picture axes are unreadable
HTML_MAX_TOKENS = 256  # the page embeds at most the last this many tokens
SCORE_RULE = ("each score is a mean over query rows i >= 2 of a value in [0, 1]: previous a[i,i-1], "
              "self a[i,i], first a[i,0], broad entropy(a[i]) / log(i+1); the largest names the pattern")

# -----------------------------------------------------------------------------
# Stitching the generation's steps into full maps


def assemble(steps):
    """Build one (n_head, T, T) float32 map per layer from generation steps.

    steps: list of (maps, window_start), one per forward of the generation, in
    order, for a single sequence. maps holds one (n_head, Tq, Tk) array per
    layer: the weights of Tq queries over the Tk positions of the model's
    context window, which starts at absolute position window_start; the
    queries are the last Tq of those positions.

    Rows are kept by absolute position. A row computed in an earlier window
    looked at different keys (and had different position embeddings), so when
    the window slides (window_start changes) every row kept so far is dropped;
    the forward that follows a slide recomputes the whole new window, which
    gives its rows again. A later step for a position already kept (the
    uncached path recomputes the window every step) replaces the older row.

    Returns (layers, window_start): layers is a list of (n_head, T, T) arrays
    over positions window_start .. window_start + T - 1.
    """
    if not steps:
        raise ValueError("no generation steps to assemble")
    start = None
    rows = {}  # absolute position -> per-layer list of (n_head, p - start + 1) rows
    for maps, window_start in steps:
        if window_start != start:
            start, rows = window_start, {}
        n_q, n_k = maps[0].shape[-2:]
        for i in range(n_q):
            pos = start + n_k - n_q + i
            rows[pos] = [np.asarray(m[:, i, : pos - start + 1], dtype=np.float32) for m in maps]
    T = max(rows) - start + 1
    missing = [p for p in range(start, start + T) if p not in rows]
    if missing:
        raise ValueError(f"the steps give no attention row for positions {missing[:5]}")
    n_head = rows[start][0].shape[0]
    layers = []
    for layer in range(len(steps[-1][0])):
        full = np.zeros((n_head, T, T), dtype=np.float32)  # above the diagonal stays exactly 0
        for pos, per_layer in rows.items():
            i = pos - start
            full[:, i, : i + 1] = per_layer[layer]
        layers.append(full)
    return layers, start


# -----------------------------------------------------------------------------
# What kind of head is it?


def head_stats(a):
    """Mean entropy and pattern scores of one head's causal map a (T, T).

    Each score is a mean over query rows i of a number in [0, 1], so the four
    are comparable and the largest names the head's dominant pattern:

      previous  a[i, i-1]: the weight on the token just before the query
      self      a[i, i]: the weight on the query token itself
      first     a[i, 0]: the weight on the first token of the window
      broad     H_i / log(i + 1): the row's entropy over the largest entropy
                its i + 1 visible keys allow (1 = spread evenly over them)

    The mean runs over rows i >= 2: row 0 can only attend to itself and in
    row 1 the previous token is also the first, so those rows say nothing
    about the head. Maps shorter than 3 tokens use every row (and row 0 counts
    as fully broad). Ties go to the earlier pattern in the list above.
    entropy is the mean of H_i = -sum_j a[i, j] log a[i, j] in nats over the
    same rows. Returns {"entropy", "scores": {pattern: score}, "pattern", "score"}.
    """
    a = np.asarray(a, dtype=np.float64)
    T = a.shape[0]
    rows = np.arange(2, T) if T >= 3 else np.arange(T)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(a > 0, a * np.log(a), 0.0)
    entropy = -plogp.sum(axis=1)  # (T,)
    max_entropy = np.log(np.arange(T) + 1.0)  # row i sees i + 1 keys
    broad = np.divide(entropy, max_entropy, out=np.ones(T), where=max_entropy > 0)
    prev = np.concatenate([[0.0], np.diagonal(a, offset=-1)])  # prev[i] = a[i, i-1]
    scores = {
        "previous": prev[rows].mean(),
        "self": np.diagonal(a)[rows].mean(),
        "first": a[rows, 0].mean(),
        "broad": np.clip(broad[rows], 0.0, 1.0).mean(),
    }
    scores = {k: round(float(v), 4) for k, v in scores.items()}
    pattern = classify(scores)
    return {"entropy": round(float(entropy[rows].mean()), 4), "scores": scores,
            "pattern": pattern, "score": scores[pattern]}


def classify(scores):
    """The dominant pattern: the highest score, ties to the earlier in PATTERNS."""
    return max(PATTERNS, key=lambda name: (scores[name], -PATTERNS.index(name)))


def all_head_stats(layers):
    """head_stats for every head: a list of dicts with "layer" and "head" added."""
    stats = []
    for layer, maps in enumerate(layers):
        for head in range(maps.shape[0]):
            stats.append({"layer": layer, "head": head, **head_stats(maps[head])})
    return stats


def format_table(stats):
    """The heads' stats as a small text table."""
    lines = ["layer  head  entropy  pattern   score"]
    for s in stats:
        lines.append(f"{s['layer']:>5}  {s['head']:>4}  {s['entropy']:>7.2f}  "
                     f"{s['pattern']:<8}  {s['score']:>5.2f}")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Writing the files


def display_token(s):
    """A token as a label: visible spaces and line breaks, nothing invisible."""
    s = s.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s)


def save_npz(path, layers, tokens, token_ids=None, window_start=0):
    arrays = {f"layer_{i}": np.asarray(m, dtype=np.float32) for i, m in enumerate(layers)}
    arrays["tokens"] = np.array(tokens, dtype=str)
    arrays["token_ids"] = np.array([] if token_ids is None else token_ids, dtype=np.int64)
    arrays["window_start"] = np.array(window_start, dtype=np.int64)
    np.savez_compressed(path, **arrays)


def save_pngs(folder, layers, tokens, window_start=0):
    """One PNG per layer: its heads' heatmaps in a grid, the axes in absolute
    positions (the window starts at window_start). Returns the paths."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    T = len(tokens)
    labels = [display_token(t) for t in tokens] if T <= LABEL_MAX_TOKENS else None
    # labelled panels grow with T so that every label gets about 11 points of axis
    panel = max(3.5, 0.16 * T) if labels else 3.5
    future = np.triu(np.ones((T, T), dtype=bool), 1)  # masked keys: grey, not "weight 0"
    cmap = plt.get_cmap("Blues").with_extremes(bad="#e8e8e8")
    lo, hi = window_start - 0.5, window_start + T - 0.5
    extent = (lo, hi, hi, lo)  # cell centres at absolute positions, query 0 at the top
    paths = []
    for layer, maps in enumerate(layers):
        n_head = maps.shape[0]
        cols = math.ceil(math.sqrt(n_head))
        rows = math.ceil(n_head / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(panel * cols + 1.2, panel * rows + 0.5),
                                 squeeze=False, layout="constrained")
        for head, ax in enumerate(axes.flat):
            if head >= n_head:
                ax.axis("off")
                continue
            # a square-root colour scale, so weak but spread-out attention still shows
            im = ax.imshow(np.ma.masked_where(future, maps[head]), cmap=cmap, extent=extent,
                           norm=PowerNorm(0.5, vmin=0.0, vmax=1.0), interpolation="nearest")
            ax.set_title(f"layer {layer}, head {head}", fontsize=10)
            if labels:
                ticks = range(window_start, window_start + T)
                ax.set_xticks(ticks, labels, fontsize=7, rotation=90)
                ax.set_yticks(ticks, labels, fontsize=7)
                ax.tick_params(length=0)
            else:
                ax.tick_params(labelsize=7)
        fig.suptitle(f"Layer {layer}: attention weights (rows: query token, columns: key token)",
                     fontsize=11)
        fig.colorbar(im, ax=axes, shrink=0.5, label="weight")
        path = os.path.join(folder, f"layer_{layer}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _encode_head(a):
    """One head's lower triangle as base64 bytes round(255 * sqrt(w)), row by row.

    The square root keeps small weights visible (w = 0.004 is byte 16) while the
    page stays small; the page squares the byte back: about +-0.004 near w = 1.
    """
    T = a.shape[0]
    tri = a[np.tril_indices(T)]  # row i contributes a[i, 0..i]
    q = np.rint(255.0 * np.sqrt(np.clip(tri, 0.0, 1.0))).astype(np.uint8)
    return base64.b64encode(q.tobytes()).decode("ascii")


def save_html(path, layers, tokens, window_start=0, stats=None):
    """The viewer page: everything inline, the maps embedded as JSON."""
    T = len(tokens)
    keep = min(T, HTML_MAX_TOKENS)
    data = {
        "tokens": [display_token(t) for t in tokens[T - keep:]],
        "first_position": window_start + T - keep,
        "total_tokens": T,
        "maps": [[_encode_head(m[h, T - keep:, T - keep:]) for h in range(m.shape[0])] for m in layers],
        "stats": stats or [],
    }
    # inside <script>, "<" could close the tag early: escape it (and friends)
    blob = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_PAGE.replace("__DATA__", blob))


def write_all(folder, layers, tokens, token_ids=None, window_start=0):
    """Write attention.npz, layer_N.png, index.html and heads.json into folder.
    Returns the heads' stats (see all_head_stats)."""
    if len(tokens) != layers[0].shape[-1]:
        raise ValueError(f"{len(tokens)} tokens for maps of size {layers[0].shape[-1]}")
    os.makedirs(folder, exist_ok=True)
    stats = all_head_stats(layers)
    save_npz(os.path.join(folder, "attention.npz"), layers, tokens, token_ids, window_start)
    save_pngs(folder, layers, tokens, window_start)
    save_html(os.path.join(folder, "index.html"), layers, tokens, window_start, stats)
    with open(os.path.join(folder, "heads.json"), "w", encoding="utf-8") as f:
        json.dump({"rule": SCORE_RULE, "patterns": list(PATTERNS),
                   "tokens": len(tokens), "heads": stats}, f, indent=1)
    return stats


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Attention maps</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 20px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; }
.note { color: #666; font-size: 12px; margin: 0 0 12px; max-width: 1100px; }
.controls { margin-bottom: 12px; display: flex; flex-wrap: wrap; gap: 6px; align-items: center; }
.controls select { margin-right: 10px; font-size: 14px; }
.controls button { font: 12px system-ui, sans-serif; padding: 3px 8px; border: 1px solid #bbb;
  background: #fafafa; border-radius: 4px; cursor: pointer; }
.controls button.on { background: #2a6fb0; border-color: #2a6fb0; color: #fff; }
.main { display: flex; gap: 28px; align-items: flex-start; }
canvas { cursor: crosshair; }
#hover { height: 18px; font: 12px monospace; color: #444; margin-top: 4px; }
.side { min-width: 300px; }
.side h2 { font-size: 14px; margin: 0 0 8px; }
#top div { display: flex; align-items: center; gap: 6px; font: 12px monospace; margin: 3px 0; }
#top .bar { display: inline-block; height: 10px; background: #2a6fb0; }
#tokens { margin-top: 16px; display: flex; flex-wrap: wrap; gap: 2px; font-family: monospace; }
#tokens span { display: inline-flex; flex-direction: column; align-items: center; min-width: 26px;
  padding: 2px 2px 1px; border-radius: 3px; cursor: pointer; white-space: pre; }
#tokens span.query { outline: 2px solid #d33; }
#tokens span.future { color: #bbb; }
#tokens small { font-size: 9px; height: 11px; opacity: 0.8; }
</style>
</head>
<body>
<h1>Attention maps</h1>
<p class="note" id="note"></p>
<div class="controls">layer <select id="layer"></select> head <span id="heads"></span></div>
<div class="main">
  <div><canvas id="map"></canvas><div id="hover"></div></div>
  <div class="side"><h2 id="qtitle"></h2><div id="top"></div></div>
</div>
<div id="tokens"></div>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const T = D.tokens.length, nLayer = D.maps.length, nHead = D.maps[0].length;
const $ = id => document.getElementById(id);
const cell = Math.max(1, Math.min(28, Math.floor(560 / T)));
const canvas = $("map"), ctx = canvas.getContext("2d");
const font = "11px monospace";
// token labels along the axes when the cells are big enough to point at
const labels = cell >= 12;
const label = t => t.length > 8 ? t.slice(0, 7) + "\u2026" : t;
ctx.font = font;
const margin = labels ? Math.ceil(Math.max(...D.tokens.map(t => ctx.measureText(label(t)).width))) + 8 : 0;
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
  if (labels) {
    ctx.font = font; ctx.textBaseline = "middle";
    for (let i = 0; i < T; i++) {
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

function headButtons() {  // one button per head of this layer, named by its pattern
  $("heads").replaceChildren(...[...Array(nHead).keys()].map(h => {
    const s = D.stats.find(s => s.layer === layer && s.head === h);
    const b = document.createElement("button");
    b.textContent = s ? `${h}: ${s.pattern} ${s.score.toFixed(2)}` : String(h);
    if (s) b.title = `mean entropy ${s.entropy.toFixed(2)} nats; scores ` +
      Object.entries(s.scores).map(([k, v]) => `${k} ${v.toFixed(2)}`).join(", ");
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
  (D.total_tokens > T ? `, the last ${T} of ${D.total_tokens}; weight on earlier ones is not shown` : "") +
  `), ${nLayer} layers x ${nHead} heads. Each row of the map is a query token, each column a token ` +
  `it can attend to; darker is more weight (square-root scale). Hover or click a token or a row.`;
headButtons();
select();
</script>
</body>
</html>
"""
