"""
Attention maps: what each head looked at while the model generated a sample.

engine.stream(..., attention=True) yields, for every new token, the
attention weights of the forward that produced it: the prompt's prefill gives
full (n_head, T, T) maps, each cached decode step adds one (n_head, 1, Tk) row.
assemble() stitches these steps back into one (n_head, T, T) map per layer, and
write_all() saves them in four forms:

  attention.npz   layer_0, layer_1, ...: float32 (n_head, T, T); tokens: the T
                  token strings; token_ids and window_start: which tokens these
                  are, so the maps can be recomputed with one forward
  layer_N.png     one picture per layer, a grid of its heads' heatmaps, each titled
                  with its label, every row and column named by its token
  index.html      a self-contained viewer: pick a layer and head, hover a token
                  (its HTML, CSS and JavaScript are the files in attention_page/,
                  inlined with the maps into this one file, which opens offline)
  heads.json      per head: what share of its attention each class of keys gets,
                  and the label that names its pattern (head_stats; heads.py
                  measures the same over the val split, with importance)

Only numpy is needed here; matplotlib is imported when the pictures are drawn.
"""

import base64
import json
import math
import os
import unicodedata

import numpy as np

# up to this many tokens every row and column of a picture is named by its token; above
# it, every k-th, so that the labels stay some 11 points apart and readable
LABEL_MAX_TOKENS = 64
HTML_MAX_TOKENS = 256  # the page embeds at most the last this many tokens
# the viewer page's HTML, CSS and JavaScript, found beside this file wherever the project runs from
PAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_page")

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
            start = window_start
            rows = {}
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
#
# Every key a query can see falls in exactly one class, the first that fits:
#   diagonal   the query itself and the BAND tokens before it
#   first      the window's first token: a vertical stripe, an attention sink
#   delimiter  a newline, space or punctuation token: vertical stripes
#   block      the rest of the query's own line or clause
#   earlier    the rest: text before the query's line or clause
# so on every query row a head's shares of the classes add up to 1, and one
# scale compares them. lift = share / the fraction of the visible keys in the
# class, which is what a head spreading its weight evenly would give: lift 1 is
# no preference. The thresholds of the label rule (docs/heads.md explains them):

CLASSES = ("diagonal", "first", "delimiter", "block", "earlier")
DELIMITERS = ("newline", "space", "punct")
# what a head dominated by one class is called: the diagonal and the delimiter
# classes by their kind; the other labels are "mixed: A+B", "weak A", "broad", "other"
NAMES = ("previous", "self", "band", "first", *DELIMITERS, "block", "earlier")
BAND = 3  # the diagonal holds the query and the 3 tokens before it
CLAUSE_END = ".,;:!?"  # punctuation that ends a clause, and so a block
# a previous- or self-token head puts >= 0.4 on that key (the TransformerLens tutorials' detectors)
ONE_KEY = 0.4
# a class names the head when it holds >= 0.4 of the weight (the same bar, for every class) ...
DOMINANT = 0.4
RUNNER_UP = 2.0  # ... and at least twice the share of the next preferred class
# a class counts only when its lift is >= 1.5: half as much again as even attention gives it
PREFERRED = 1.5
MIXED = (0.2, 0.5)  # else two preferred classes, each >= 0.2 and together >= 0.5: "mixed: A+B"
SPARSE = (3, 0.9)  # sparse: a row's 3 largest weights hold >= 0.9 of it, on average
# broad: a row's entropy is >= 0.8 of its largest possible, log(visible keys), on average
BROAD = 0.8
LABEL_RULE = (
    f"keys fall in one class each: diagonal (the query and the {BAND} tokens before it), "
    "first (the window's first token), delimiter (newline, space or punctuation tokens), "
    "block (the rest of the query's line or clause), earlier (the rest); "
    f"shares are mean weights over query rows i > {BAND}, "
    "lift = share / fraction of the visible keys in the class. "
    f"A class with lift >= {PREFERRED:g} and share >= {DOMINANT:g}, "
    f"at least {RUNNER_UP:g}x any other such class, names the head "
    f"(diagonal as previous or self when that one key has >= {ONE_KEY:g}, else band; "
    "delimiter by the kind with most weight); "
    f"else two such classes with shares >= {MIXED[0]:g} and together >= {MIXED[1]:g} "
    "give 'mixed: A+B'; "
    f"else 'broad' when the mean entropy is >= {BROAD:g} of its maximum, "
    "'weak A' when a class is still preferred, 'other' when none is. "
    f"Concentration: sparse when the {SPARSE[0]} largest weights of a row hold >= {SPARSE[1]:g}, "
    "broad as above, else focused"
)


def token_kind(s):
    """'newline', 'space' or 'punct' for a delimiter token, else None. A BPE
    token counts when it holds a newline, is all whitespace, or is punctuation
    with at most spaces around it."""
    if "\n" in s:
        return "newline"
    if s.isspace():
        return "space"
    core = s.strip()
    if core and all(unicodedata.category(c).startswith("P") for c in core):
        return "punct"
    return None


def delimiter_index(s):
    """A token's index into DELIMITERS, or -1 when it is not a delimiter."""
    kind = token_kind(s)
    if kind is None:
        return -1
    return DELIMITERS.index(kind)


def key_classes(tokens):
    """The class of every (query, key) pair of a window of tokens (strings).

    Returns (classes (T, T) int: an index into CLASSES, -1 above the diagonal;
    kinds (T,) int: each token's index into DELIMITERS, -1 for other tokens).
    """
    T = len(tokens)
    kinds = np.array([delimiter_index(t) for t in tokens], dtype=int)
    ends = np.array(
        [k == 0 or (k == 2 and t.strip()[-1] in CLAUSE_END) for t, k in zip(tokens, kinds)],
        dtype=bool,
    )
    pos = np.arange(T)
    last_end = np.maximum.accumulate(np.where(ends, pos, -1))  # the last end at or before p
    # query i's block starts after an end before i
    block_start = np.concatenate([[0], last_end[:-1] + 1])
    i, j = pos[:, None], pos[None, :]
    classes = np.full((T, T), CLASSES.index("earlier"))
    classes[j >= block_start[:, None]] = CLASSES.index("block")  # the later classes win
    classes[:, kinds >= 0] = CLASSES.index("delimiter")
    classes[:, 0] = CLASSES.index("first")
    classes[j >= i - BAND] = CLASSES.index("diagonal")
    classes[j > i] = -1
    return classes, kinds


def pattern_sums(maps, tokens):
    """Sums over the query rows of one window that describe() turns into a
    head's shares, lifts, concentration and label; maps (H, T, T) holds the H
    heads' weights over tokens. Sums of several windows add up key by key.

    The rows are i > BAND, where the first token lies outside the diagonal and
    the classes are told apart (every row in windows of BAND + 1 tokens or fewer).
    """
    a = np.asarray(maps, dtype=np.float64)
    T = a.shape[-1]
    classes, kinds = key_classes(tokens)
    rows = np.arange(BAND + 1, T) if T > BAND + 1 else np.arange(T)
    R = len(rows)
    a, classes = a[:, rows], classes[rows]  # (H, R, T), (R, T)
    onehot = (classes[..., None] == np.arange(len(CLASSES))).astype(np.float64)  # (R, T, C)
    delimiter = classes == CLASSES.index("delimiter")
    kind_hot = (delimiter[..., None] & (kinds[None, :, None] == np.arange(len(DELIMITERS)))).astype(
        np.float64
    )
    n_keys = rows + 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        log_a = np.where(a > 0, np.log(a), 0.0)
        entropy = -(a * log_a).sum(-1)  # (H, R)
    max_entropy = np.log(n_keys)
    # the scores' spread, recovered from the weights: log softmax(s)_j = s_j - logsumexp(s),
    # so over a row's keys log w has the scores' standard deviation (keys whose weight
    # rounds to 0 are left out; the scaled scores q k^T / sqrt(d) as the model computes them)
    seen = (np.arange(T)[None, :] <= rows[:, None]) & (a > 0)  # (H, R, T)
    n_seen = np.maximum(seen.sum(-1), 1)
    mean = np.where(seen, log_a, 0.0).sum(-1) / n_seen
    score_var = np.where(seen, (log_a - mean[..., None]) ** 2, 0.0).sum(-1) / n_seen
    spread = np.divide(entropy, max_entropy, out=np.ones_like(entropy), where=max_entropy > 0)
    r = np.arange(R)
    return {
        "rows": R,
        "share": np.einsum("hrt,rtc->hc", a, onehot),  # (H, C)
        "fraction": (onehot.sum(1) / n_keys[:, None]).sum(0),  # (C,): even attention's shares
        "kind": np.einsum("hrt,rtk->hk", a, kind_hot),  # (H, 3): the delimiter share by kind
        "self": a[:, r, rows].sum(-1),
        "previous": np.where(rows > 0, a[:, r, np.maximum(rows - 1, 0)], 0.0).sum(-1),
        "entropy": entropy.sum(-1),
        "spread": np.clip(spread, 0.0, 1.0).sum(-1),
        "score_std": np.sqrt(score_var).sum(-1),
        "top": np.sort(a, axis=-1)[..., -SPARSE[0] :].sum(-1).sum(-1),
    }


def add_sums(x, y):
    """The pattern_sums of two sets of windows together."""
    return y if x is None else {k: x[k] + y[k] for k in x}


def describe(sums, head):
    """One head's pattern from pattern_sums: {"label", "scores" (class shares),
    "lift", "concentration", "entropy" (mean nats), "entropy_ratio" (the mean of
    entropy / log(visible keys): 1 is even attention, 0 one key), "score_std" (the
    mean standard deviation of a row's scaled scores), "self_weight",
    "previous_weight" (the mean weight on the query, on the token before it)}."""
    n = sums["rows"]
    shares = dict(zip(CLASSES, sums["share"][head] / n))
    fraction = dict(zip(CLASSES, sums["fraction"] / n))
    lift = {c: shares[c] / fraction[c] if fraction[c] > 0 else None for c in CLASSES}
    self_ = sums["self"][head] / n
    previous = sums["previous"][head] / n
    if sums["top"][head] / n >= SPARSE[1]:
        concentration = "sparse"
    elif sums["spread"][head] / n >= BROAD:
        concentration = "broad"
    else:
        concentration = "focused"
    # a head that wins on the diagonal is named after the one key it prefers, if any
    if previous >= max(ONE_KEY, self_):
        diagonal = "previous"
    elif self_ >= ONE_KEY:
        diagonal = "self"
    else:
        diagonal = "band"
    names = {
        "diagonal": diagonal,
        "delimiter": DELIMITERS[int(np.argmax(sums["kind"][head]))],
    }
    return {
        "label": label(shares, lift, names, concentration),
        "scores": {c: round(float(v), 4) for c, v in shares.items()},
        "lift": {c: None if v is None else round(float(v), 3) for c, v in lift.items()},
        "concentration": concentration,
        "entropy": round(float(sums["entropy"][head] / n), 4),
        "entropy_ratio": round(float(sums["spread"][head] / n), 4),
        "score_std": round(float(sums["score_std"][head] / n), 4),
        "self_weight": round(float(self_), 4),
        "previous_weight": round(float(previous), 4),
    }


def label(shares, lift, names, concentration):
    """The rule of LABEL_RULE. names: what to call a class that wins (the
    diagonal and delimiter classes are named by their kind)."""
    preferred = sorted(
        (c for c in CLASSES if lift[c] is not None and lift[c] >= PREFERRED),
        key=lambda c: -shares[c],
    )
    name = [names.get(c, c) for c in preferred]
    top = [shares[c] for c in preferred] + [0.0, 0.0]
    if preferred and top[0] >= DOMINANT and top[0] >= RUNNER_UP * top[1]:
        return name[0]
    if len(preferred) > 1 and top[1] >= MIXED[0] and top[0] + top[1] >= MIXED[1]:
        return f"mixed: {name[0]}+{name[1]}"
    if concentration == "broad":
        return "broad"
    return f"weak {name[0]}" if preferred else "other"


def head_stats(a, tokens):
    """describe() of one head's causal map a (T, T) over the T tokens."""
    return describe(pattern_sums(np.asarray(a)[None], tokens), 0)


def all_head_stats(layers, tokens):
    """describe() for every head of maps over the same tokens: a list of dicts
    with "layer" and "head" added."""
    stats = []
    for layer, maps in enumerate(layers):
        sums = pattern_sums(maps, tokens)
        stats.extend({"layer": layer, "head": h, **describe(sums, h)} for h in range(maps.shape[0]))
    return stats


def format_table(stats):
    """The heads' patterns as a small text table: label, concentration, class shares."""
    lines = ["layer  head  label                     concentration  " + "  ".join(CLASSES)]
    for s in stats:
        shares = "  ".join(f"{s['scores'][c]:>{len(c)}.2f}" for c in CLASSES)
        lines.append(
            f"{s['layer']:>5}  {s['head']:>4}  {s['label']:<24}  {s['concentration']:<13}  {shares}"
        )
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


def save_pngs(folder, layers, tokens, window_start=0, stats=None, note=""):
    """One PNG per layer: its heads' heatmaps in a grid, each row and column named by
    its token (every k-th past LABEL_MAX_TOKENS), the positions absolute (the maps
    start at window_start). stats (all_head_stats) titles each head with its label;
    note ends the picture's title. Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    T = len(tokens)
    every = math.ceil(T / LABEL_MAX_TOKENS)
    labels = [display_token(t) for t in tokens]
    # a panel grows with the labels it shows, so that each gets about 11 points of axis
    panel = max(3.5, 0.16 * math.ceil(T / every))
    future = np.triu(np.ones((T, T), dtype=bool), 1)  # masked keys: grey, not "weight 0"
    cmap = plt.get_cmap("Blues").with_extremes(bad="#e8e8e8")
    lo, hi = window_start - 0.5, window_start + T - 0.5
    extent = (lo, hi, hi, lo)  # cell centres at absolute positions, query 0 at the top
    ticks = range(window_start, window_start + T, every)
    names = labels[::every]
    # characters stand upright and larger; longer tokens (BPE) turn to fit their columns
    short = max(len(n) for n in names) <= 2
    size = 9 if short else 7
    titles = {(s["layer"], s["head"]): s["label"] for s in stats or []}
    paths = []
    for layer, maps in enumerate(layers):
        n_head = maps.shape[0]
        cols = math.ceil(math.sqrt(n_head))
        rows = math.ceil(n_head / cols)
        fig, axes = plt.subplots(
            rows,
            cols,
            figsize=(panel * cols + 1.2, panel * rows + 0.8),
            squeeze=False,
            layout="constrained",
        )
        for head, ax in enumerate(axes.flat):
            if head >= n_head:
                ax.axis("off")
                continue
            # a square-root colour scale, so weak but spread-out attention still shows
            im = ax.imshow(
                np.ma.masked_where(future, maps[head]),
                cmap=cmap,
                extent=extent,
                norm=PowerNorm(0.5, vmin=0.0, vmax=1.0),
                interpolation="nearest",
            )
            title = f"layer {layer}, head {head}"
            if (layer, head) in titles:
                title += f": {titles[layer, head]}"
            ax.set_title(title, fontsize=12)
            ax.set_xticks(ticks, names, fontsize=size, rotation=0 if short else 90)
            ax.set_yticks(ticks, names, fontsize=size)
            ax.tick_params(length=0)
            ax.set_xlabel("key (the token attended to)", fontsize=9)
            ax.set_ylabel("query (the token attending)", fontsize=9)
        heading = f"Layer {layer}: attention weights, tokens {window_start}..{window_start + T - 1}"
        if every > 1:
            heading += f" (every {every}th named)"
        fig.suptitle(f"{heading}{note}", fontsize=13)
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


def save_html(path, layers, tokens, window_start=0, stats=None, hidden=0):
    """The viewer page: everything inline, the maps embedded as JSON. hidden: how many
    tokens before window_start the rows also attended to (their weight is not drawn)."""
    T = len(tokens)
    keep = min(T, HTML_MAX_TOKENS)
    data = {
        "tokens": [display_token(t) for t in tokens[T - keep :]],
        "first_position": window_start + T - keep,
        "total_tokens": T,
        "hidden": hidden + T - keep,
        "maps": [
            [_encode_head(m[h, T - keep :, T - keep :]) for h in range(m.shape[0])] for m in layers
        ],
        "stats": stats or [],
    }
    # inside <script>, "<" could close the tag early: escape it (and friends)
    blob = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page(blob))


def page(blob):
    """The page with its style, script and data inline: one file that opens offline.

    page.html, page.css and page.js sit beside this module (attention_page/) so
    that they can be read and edited as a web page; page.html links the other
    two, and each link is replaced here by the file's text.
    """
    html = _read_page_file("page.html").replace("__DATA__", blob)
    css = _read_page_file("page.css")
    js = _read_page_file("page.js")
    html = _inline(html, '<link rel="stylesheet" href="page.css">', "style", css)
    html = _inline(html, '<script src="page.js"></script>', "script", js)
    return html


def _read_page_file(name):
    with open(os.path.join(PAGE_DIR, name), encoding="utf-8") as f:
        return f.read()


def _inline(html, link, element, text):
    """Replace the one link in html by the element holding text inline."""
    if html.count(link) != 1:
        raise ValueError(f"page.html must hold {link} exactly once")
    # the browser ends the element at the first closing tag, wherever it is
    if f"</{element}" in text.lower():
        raise ValueError(f"the file behind {link} must not hold </{element}")
    return html.replace(link, f"<{element}>\n{text}</{element}>")


def write_all(folder, layers, tokens, token_ids=None, window_start=0, whole=None, seen_from=None):
    """Write attention.npz, layer_N.png, index.html and heads.json into folder.

    layers: the maps to draw, over tokens at positions window_start onwards. whole:
    (layers, tokens, window_start) of a longer text around them, whose maps name the
    heads (more rows, steadier labels); None: the drawn maps name them. seen_from: the
    first position the drawn rows could attend to, where it comes before window_start
    (their weight on the keys before it is not drawn). Returns the heads' stats."""
    if len(tokens) != layers[0].shape[-1]:
        raise ValueError(f"{len(tokens)} tokens for maps of size {layers[0].shape[-1]}")
    if whole is None:
        whole = (layers, tokens, window_start)
    os.makedirs(folder, exist_ok=True)
    stats = all_head_stats(whole[0], whole[1])
    labelled = (whole[2], whole[2] + len(whole[1]) - 1)
    note = ""
    if labelled != (window_start, window_start + len(tokens) - 1):
        note = f"; labels over tokens {labelled[0]}..{labelled[1]} (heads.json)"
    hidden = 0
    if seen_from is not None:
        hidden = window_start - seen_from
    save_npz(os.path.join(folder, "attention.npz"), layers, tokens, token_ids, window_start)
    save_pngs(folder, layers, tokens, window_start, stats, note)
    save_html(os.path.join(folder, "index.html"), layers, tokens, window_start, stats, hidden)
    with open(os.path.join(folder, "heads.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "rule": LABEL_RULE,
                "classes": list(CLASSES),
                "tokens": len(whole[1]),
                "positions": list(labelled),
                "heads": stats,
            },
            f,
            indent=1,
        )
    return stats
