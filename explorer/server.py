"""
The attention explorer behind explore.py: the analysis of a prompt and a local web server.

Explorer holds one loaded model and answers the questions the page asks:
analyze (every head's attention on a prompt, its label, the next-token
probabilities, the loss of each token, a greedy continuation, the logit lens and
the direct logit attribution, with a set of heads switched off and, beside it,
intact), generate (sampled tokens, one by one) and patch (activation patching of
every head, clean prompt into corrupt). Ablation is head_measures.ablated, the
definition heads.py uses, and labels follow attention_maps' rule over the
prompt, as sample.py's do, with heads.py's induction probe on top; the lens,
the attribution and patching are explorer/interpret.py's. Every number comes
from the model's own forward: the page is a window onto model.py, not a second
implementation. Given a training run's folder, it also serves the run's
snapshots (support/timeline.py): every question may name a "step"; and the
run's evaluations, read while train.py writes them (explorer/live.py), for
the page's timeline; and the heads' composition scores (support/composition.py).

The server is the standard library's ThreadingHTTPServer. It serves the page's
five files by fixed name (no path from a request ever reaches the file
system) and a JSON API; a bad request gets a 4xx with one line saying what to
fix. Ablation hooks change the shared model, so every use of the model holds
one lock: several tabs are answered correctly, one forward at a time.
"""

import json
import math
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import numpy as np
import torch
import torch.nn.functional as F

from data.tokenizer import TokenizerError
from explorer import interpret
from explorer.live import RunLog
from support import attention_maps, composition, engine, head_measures, timeline
from support.checkpoint import CheckpointError
from support.loading import LoadError, load_model

PAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page")
# the only files the server reads after it starts, by the path the page asks for
PAGE_FILES = {
    "/": "index.html",
    "/explorer.js": "explorer.js",
    "/panels.js": "panels.js",
    "/timeline.js": "timeline.js",
    "/explorer.css": "explorer.css",
}
PAGE_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}  # all UTF-8
MAX_BODY = 1 << 20  # bytes: a request body larger than this is refused before it is read
TOP = 10  # next-token candidates shown
CONTINUATION = 20  # tokens of the greedy continuation beside each analysis
MAX_CONTINUATION = 200
MAX_NEW_TOKENS = 2000  # the most tokens one /api/generate may ask for
MAX_WEIGHTS = 8_000_000  # attention weights of one model in an answer: about 60 MB of JSON
# tokens in a patching pass, n_layer * n_head copies of the prompt: GPT-2 124M's 144 heads
# take up to 455 tokens, in about 1 GB of activations
MAX_PATCH_TOKENS = 1 << 16
DIGITS = 6  # attention weights are rounded to 6 decimals: 5e-7 at most, a shorter JSON
SEED = 1337  # the induction probe's random tokens, heads.py's default seed
PROBES_KEPT = 64  # induction probes kept, one per set of heads switched off
STEPS_KEPT = 4  # snapshots of a run kept loaded at once

# a head's share of the clean - corrupt difference is (patched - corrupt) / (clean - corrupt),
# and each logit there carries rounding of about eps(dtype) * the logits' size: a difference
# under ten times that would make every share a tenth rounding or more
MIN_GAP_ROUNDINGS = 10

ANALYZE_FIELDS = {"prompt", "ablate", "continuation", "attribute", "step"}
GENERATE_FIELDS = {"prompt", "ablate", "max_new_tokens", "temperature", "top_k", "seed", "step"}
PATCH_FIELDS = {"clean", "corrupt", "target", "foil", "ablate", "step"}
COMPOSITION_FIELDS = {"step"}


class RequestError(Exception):
    """A request the explorer cannot answer; the message is one line saying what to fix."""


# -----------------------------------------------------------------------------
# Checking a request


def check_fields(body, allowed):
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r}; known fields: {', '.join(sorted(allowed))}"
        )


def integer(body, key, default, low, high):
    """body[key] as an int in low..high, or default when it is absent."""
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{key} must be an integer from {low} to {high}, got {value!r}")
    return value


def number(body, key, default, low, high):
    """body[key] as a float in low..high, or default when it is absent."""
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{key} must be a number from {low} to {high}, got {value!r}")
    return float(value)


class Explorer:
    """One model, its tokenizer, and the lock that every use of the model holds.
    run_dir: the training run's folder, whose snapshots the requests may name by step
    and whose log the timeline draws; step: the iter of the model given, None when
    unknown; opened: where it came from, "ckpt.pt" or "snapshot"."""

    def __init__(self, model, tok, run_dir=None, step=None, lock=None, opened="ckpt.pt"):
        self.model = model
        self.tok = tok
        self.config = model.config
        self.device = model.lm_head.weight.device
        self.lock = lock or threading.Lock()
        self.run_dir = run_dir
        self.step = step
        self.opened = opened
        self.run = RunLog(run_dir)
        self.snapshots = {}  # step -> the Explorer of that snapshot, the most recent last
        self.composition = None  # the Q-, K- and V-composition scores, once asked for
        # the induction probe, as heads.py measures it, by set of heads off: it does not
        # depend on the prompt, so typing with the same heads off never reruns it
        self.probes = {(): head_measures.induction_scores(model, SEED)["induction"]}

    def info(self):
        """What the page needs to know before the first analysis."""
        c = self.config
        return {
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "context": c.block_size,
            "vocab_size": c.vocab_size,
            "tokenizer": self.tok.describe()["kind"],
            "dtype": str(self.model.lm_head.weight.dtype).removeprefix("torch."),
            "label_rule": attention_maps.LABEL_RULE,
            "induction_threshold": head_measures.INDUCTION,
            "max_new_tokens": MAX_NEW_TOKENS,
        }

    def heads(self, body):
        """The request's "ablate" as a sorted list of distinct (layer, head) pairs."""
        value = body.get("ablate", [])
        n_layer, n_head = self.config.n_layer, self.config.n_head
        if not isinstance(value, list):
            raise RequestError("ablate must be a list of [layer, head] pairs, e.g. [[0, 1]]")
        pairs = set()
        for pair in value:
            ok = isinstance(pair, list) and len(pair) == 2
            if not ok or any(isinstance(v, bool) or not isinstance(v, int) for v in pair):
                raise RequestError(f"ablate holds [layer, head] pairs of integers, got {pair!r}")
            if not 0 <= pair[0] < n_layer:
                raise RequestError(
                    f"layer {pair[0]} is out of range: this model has layers 0..{n_layer - 1}"
                )
            if not 0 <= pair[1] < n_head:
                raise RequestError(
                    f"head {pair[1]} is out of range: this model has heads 0..{n_head - 1}"
                )
            pairs.add(tuple(pair))
        return sorted(pairs)

    def encode(self, body, key="prompt"):
        """The request's prompt (body[key]) as token ids, at most the model's context long."""
        prompt = body.get(key)
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(f"{key} must be a non-empty string")
        try:
            ids = self.tok.encode(prompt)
        except TokenizerError as e:
            raise RequestError(str(e)) from None
        if len(ids) > self.config.block_size:
            what = "prompt" if key == "prompt" else f"{key} prompt"
            raise RequestError(
                f"the {what} has {len(ids)} tokens, more than the model's context of "
                f"{self.config.block_size}; shorten it"
            )
        if max(ids) >= self.config.vocab_size:
            raise RequestError(
                f"token {max(ids)} is outside the model's vocabulary; "
                "the checkpoint's tokenizer does not match it"
            )
        return ids

    def token(self, body, key, name=None):
        """body[key] as a token id: an id, or a string that is one token; name: what
        the error messages call it (key)."""
        name = name or key
        value = body.get(key)
        if isinstance(value, str):
            try:
                ids = self.tok.encode(value)
            except TokenizerError as e:
                raise RequestError(f"{name}: {e}") from None
            if len(ids) != 1:
                raise RequestError(
                    f"{name} {value!r} is {len(ids)} tokens; give one token, or its id"
                )
            value = ids[0]
        return integer({name: value}, name, None, 0, self.config.vocab_size - 1)

    # -------------------------------------------------------------------------
    # A training run's steps

    def steps(self):
        """Answer GET /api/steps: the iters of the run's snapshots, and that of the
        model the explorer started with (ckpt.pt's, or a snapshot's)."""
        return {"steps": self.run.steps(), "checkpoint": self.step}

    def timeline(self, since=None):
        """Answer GET /api/timeline?since=VERSION (RunLog.answer), with where the
        model the explorer started with came from ("opened")."""
        return self.run.answer({**self.steps(), "opened": self.opened}, since)

    def at(self, body):
        """The Explorer that answers the request: this one, or that of the snapshot at
        body["step"], loaded on first use in this model's device and precision (the
        STEPS_KEPT used last stay loaded). They share this one's lock."""
        step = body.get("step")
        if step is None or step == self.step:
            return self
        if self.run_dir is None:
            raise RequestError(
                "this explorer serves one model, without steps; start explore.py with the "
                "--out_dir of a run trained with --snapshots=True"
            )
        paths = timeline.list_snapshots(self.run_dir)
        # a step is an iter: a list or an object would not even be looked up (unhashable)
        if isinstance(step, bool) or not isinstance(step, int) or step not in paths:
            raise RequestError(
                f"no snapshot at step {step!r}; GET /api/steps lists them ({len(paths)} here)"
            )
        with self.lock:
            if step not in self.snapshots:
                self.snapshots[step] = self.load_step(step, paths[step])
            explorer = self.snapshots.pop(step)
            self.snapshots[step] = explorer  # now the most recent
            if len(self.snapshots) > STEPS_KEPT:
                del self.snapshots[next(iter(self.snapshots))]
        return explorer

    def load_step(self, step, path):
        """The Explorer of one snapshot; called under the lock."""
        try:
            model, _, _ = load_model(path, self.run_dir)
        except (CheckpointError, LoadError, TokenizerError) as e:
            raise RequestError(f"step {step}: {e}") from None
        dtype = self.model.lm_head.weight.dtype
        model.to(device=self.device, dtype=dtype).eval()
        return Explorer(model, self.tok, step=step, lock=self.lock, opened="snapshot")

    # -------------------------------------------------------------------------
    # Analysis

    def analyze(self, body):
        """Answer POST /api/analyze: the model with body["ablate"]'s heads off and, when some
        are, the intact model under "intact"."""
        check_fields(body, ANALYZE_FIELDS)
        return self.at(body).analyze_here(body)

    def analyze_here(self, body):
        """analyze() with this Explorer's model."""
        ids = self.encode(body)
        # every head's (T, T) map goes into the answer: a large model's long prompt would not fit
        n_heads = self.config.n_layer * self.config.n_head
        longest = math.isqrt(MAX_WEIGHTS // n_heads)
        if len(ids) > longest:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the maps of this model's {n_heads} heads "
                f"fit an answer up to {longest} tokens; shorten it"
            )
        heads = self.heads(body)
        n_new = integer(body, "continuation", CONTINUATION, 0, MAX_CONTINUATION)
        attribute = self.attribute(body, len(ids))
        answer = self.analysis(ids, heads, n_new, attribute)
        if heads:
            answer["intact"] = self.analysis(ids, [], n_new, attribute)
        return answer

    def attribute(self, body, T):
        """The request's "attribute" as (position, token id or None: the model's choice)."""
        value = body.get("attribute", {})
        if not isinstance(value, dict) or set(value) - {"position", "token"}:
            raise RequestError(
                'attribute must be an object {"position": int, "token": id or one-token string}'
            )
        position = integer(value, "position", T - 1, 0, T - 1)
        token = None
        if "token" in value:
            token = self.token(value, "token", "attribute.token")
        return position, token

    @torch.no_grad()
    def analysis(self, ids, heads, n_new, attribute):
        """One analysis of ids with heads ablated; attribute: (position, token or None)."""
        idx = torch.tensor([ids], dtype=torch.long, device=self.device)
        with self.lock, head_measures.ablated(self.model, heads):
            with interpret.recording(self.model) as trace:
                logits, maps = self.model.attention_maps(idx)
            lens = self.lens(trace)
            why = self.attributions(trace, logits[0], ids, attribute)
            probe = self.probe(heads)
            continuation = self.greedy(idx, n_new)
        logits = logits[0].float()  # (T, vocab)
        layers = [m[0].float().cpu().numpy() for m in maps]  # n_layer x (n_head, T, T)
        token_loss = F.cross_entropy(logits[:-1], idx[0, 1:], reduction="none")  # (T - 1,)
        probs = F.softmax(logits[-1], dim=-1)
        top = torch.topk(probs, min(TOP, probs.numel()))
        strings = self.tok.token_strings(ids)
        return {
            "tokens": strings,
            "ablate": [list(h) for h in heads],
            "attention": [np.round(a, DIGITS).tolist() for a in layers],
            "labels": self.labels(layers, strings, probe),
            "token_loss": token_loss.cpu().tolist(),
            "loss": token_loss.mean().item() if len(ids) > 1 else None,
            "next": [
                {"token": self.tok.token_strings([i])[0], "id": i, "prob": p}
                for i, p in zip(top.indices.tolist(), top.values.tolist())
            ],
            "continuation": self.tok.token_strings(continuation),
            "step": self.step,
            "logit_lens": lens,
            **why,
        }

    def lens(self, trace):
        """The logit lens as the answer holds it: (n_layer + 1, T, LENS_TOP) of
        {"token", "id", "prob"}; called under the lock."""
        probs, ids = interpret.logit_lens(self.model, trace)  # (n_layer + 1, T, k) each
        lens = []
        for point_probs, point_ids in zip(probs.tolist(), ids.tolist()):
            row = []
            for cell_probs, cell_ids in zip(point_probs, point_ids):
                strings = self.tok.token_strings(cell_ids)
                row.append(
                    [
                        {"token": s, "id": i, "prob": round(p, DIGITS)}
                        for s, i, p in zip(strings, cell_ids, cell_probs)
                    ]
                )
            lens.append(row)
        return lens

    def attributions(self, trace, logits, ids, attribute):
        """The direct logit attribution asked for ("attribution") and, for the page's
        mouse, that of every prompt token after the first at the position before it
        ("token_attribution", entry t: token t + 1 at position t); under the lock."""
        position, token = attribute
        if token is None:
            token = logits[position].argmax().item()
        positions = list(range(len(ids) - 1)) + [position]
        tokens = ids[1:] + [token]
        parts = interpret.attribution(
            self.model, trace, torch.tensor(positions), torch.tensor(tokens)
        )
        own = logits[positions, tokens].float().tolist()
        strings = self.tok.token_strings(tokens)
        every = []
        for k, (p, t) in enumerate(zip(positions, tokens)):
            every.append(
                {
                    "position": p,
                    "token": strings[k],
                    "id": t,
                    "logit": own[k],
                    "heads": parts["heads"][k].tolist(),
                    "mlp": parts["mlp"][k].tolist(),
                    "embed": parts["embed"][k].item(),
                    "bias": parts["bias"][k].item(),
                }
            )
        return {"attribution": every[-1], "token_attribution": every[:-1]}

    def probe(self, heads):
        """Each head's induction score (n_layer, n_head) with heads off; called under the lock."""
        key = tuple(heads)
        if key not in self.probes:
            if len(self.probes) >= PROBES_KEPT:
                # forget the oldest set of heads, never the intact model's
                del self.probes[next(k for k in self.probes if k)]
            self.probes[key] = head_measures.induction_scores(self.model, SEED)["induction"]
        return self.probes[key]

    def greedy(self, idx, n_new):
        """The n_new most likely next tokens, one after another, as ids."""
        if n_new == 0:
            return []
        out = self.model.generate(idx, n_new, temperature=0.0)
        return out[0, idx.size(1) :].tolist()

    def labels(self, layers, strings, probe):
        """Every head's label by heads.py's rule: induction when the probe says so, else
        its pattern on this prompt (attention_maps). (n_layer) lists of (n_head) dicts."""
        stats = attention_maps.all_head_stats(layers, strings)
        out = [[None] * self.config.n_head for _ in range(self.config.n_layer)]
        for s in stats:
            score = float(probe[s["layer"], s["head"]])
            induction = score >= head_measures.INDUCTION
            out[s["layer"]][s["head"]] = {
                "label": "induction" if induction else s["label"],
                "pattern": s["label"],
                "induction": round(score, 4),
                "scores": s["scores"],
                "concentration": s["concentration"],
            }
        return out

    # -------------------------------------------------------------------------
    # Generation

    def generate(self, body):
        """Check a POST /api/generate; return the prompt's ids and a generator of
        {"token", "id"} dicts, one per new token, sampled as sample.py samples."""
        check_fields(body, GENERATE_FIELDS)
        run = self.at(body)
        ids = run.encode(body)
        heads = run.heads(body)
        n_new = integer(body, "max_new_tokens", 100, 1, MAX_NEW_TOKENS)
        temperature = number(body, "temperature", 0.8, 0.0, 100.0)
        # as in sample.py: a top_k above the vocabulary keeps every token
        top_k = min(integer(body, "top_k", 200, 1, 10**9), self.config.vocab_size)
        seed = integer(body, "seed", 1337, 0, 2**63 - 1)
        return ids, run.sample(ids, heads, n_new, temperature, top_k, seed)

    @torch.no_grad()
    def sample(self, ids, heads, n_new, temperature, top_k, seed):
        """Yield each new token as engine.stream samples it, with heads off."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        idx = torch.tensor([ids], dtype=torch.long, device=self.device)
        stream = engine.stream(
            self.model, idx, n_new, temperature=temperature, top_k=top_k, generator=generator
        )
        try:
            for _ in range(n_new):
                # the lock per token: another tab's analysis may run between two of them
                with self.lock, head_measures.ablated(self.model, heads):
                    token = next(stream)[0].item()
                yield {"token": self.tok.token_strings([token])[0], "id": token}
        finally:
            stream.close()

    # -------------------------------------------------------------------------
    # Activation patching

    def patch(self, body):
        """Answer POST /api/patch: for every head, how much of the clean prompt's
        logit[target] - logit[foil] at the last position it restores when its output
        is patched into the corrupt prompt's run (interpret.patch_heads)."""
        check_fields(body, PATCH_FIELDS)
        return self.at(body).patch_here(body)

    def patch_here(self, body):
        """patch() with this Explorer's model."""
        clean = self.encode(body, "clean")
        corrupt = self.encode(body, "corrupt")
        if len(clean) != len(corrupt):
            raise RequestError(
                f"clean has {len(clean)} tokens and corrupt {len(corrupt)}; patching needs "
                "two prompts of the same token length"
            )
        copies = self.config.n_layer * self.config.n_head
        if copies * len(clean) > MAX_PATCH_TOKENS:
            raise RequestError(
                f"patching this model's {copies} heads fits prompts of up to "
                f"{MAX_PATCH_TOKENS // copies} tokens, not {len(clean)}; shorten them"
            )
        target = self.token(body, "target")
        foil = self.token(body, "foil")
        if target == foil:
            raise RequestError("target and foil are the same token; give two different ones")
        heads = self.heads(body)
        clean_idx = torch.tensor([clean], dtype=torch.long, device=self.device)
        corrupt_idx = torch.tensor([corrupt], dtype=torch.long, device=self.device)
        with self.lock, head_measures.ablated(self.model, heads):
            result = interpret.patch_heads(self.model, clean_idx, corrupt_idx, target, foil)
        clean_diff = result["clean_diff"]
        corrupt_diff = result["corrupt_diff"]
        gap = clean_diff - corrupt_diff
        self.check_gap(gap, clean_diff, corrupt_diff, result["logit_scale"])
        patched = result["patched"].cpu().numpy()
        return {
            "clean": self.tok.token_strings(clean),
            "corrupt": self.tok.token_strings(corrupt),
            "target": {"token": self.tok.token_strings([target])[0], "id": target},
            "foil": {"token": self.tok.token_strings([foil])[0], "id": foil},
            "ablate": [list(h) for h in heads],
            "step": self.step,
            "clean_diff": clean_diff,
            "corrupt_diff": corrupt_diff,
            "patched": np.round(patched, DIGITS).tolist(),
            "heads": np.round((patched - corrupt_diff) / gap, DIGITS).tolist(),
        }

    def check_gap(self, gap, clean_diff, corrupt_diff, scale):
        """Refuse a clean - corrupt difference too small to divide by: under
        MIN_GAP_ROUNDINGS times the rounding of a logit of the last position's size."""
        dtype = self.model.lm_head.weight.dtype
        rounding = torch.finfo(dtype).eps * max(1.0, scale)
        smallest = MIN_GAP_ROUNDINGS * rounding
        if abs(gap) < smallest:
            name = str(dtype).removeprefix("torch.")
            raise RequestError(
                f"clean and corrupt give logit[target] - logit[foil] = {clean_diff:.6g} and "
                f"{corrupt_diff:.6g}: a difference of {abs(gap):.3g}, under {smallest:.3g}, "
                f"{MIN_GAP_ROUNDINGS} times the rounding of {name} logits this large "
                f"({rounding:.2g}), so each head's share of it would be mostly rounding; "
                "change a prompt, the target or the foil"
            )

    # -------------------------------------------------------------------------
    # Composition

    def compose(self, body):
        """Answer POST /api/composition: the Q-, K- and V-composition scores of every
        head into every head of a later layer (support/composition.py), from the
        weights alone, so heads switched off do not change them; null where the reader's
        layer is not later than the writer's."""
        check_fields(body, COMPOSITION_FIELDS)
        return self.at(body).compose_here()

    def compose_here(self):
        """compose() with this Explorer's model, computed once and kept."""
        with self.lock:
            if self.composition is None:
                found = composition.composition_scores(self.model)
                self.composition = {
                    kind: np.where(
                        np.isnan(s.numpy()), None, np.round(s.numpy().astype(np.float64), DIGITS)
                    ).tolist()
                    for kind, s in found.items()
                }
        return {"step": self.step, **self.composition}


# -----------------------------------------------------------------------------
# The HTTP server


class Handler(BaseHTTPRequestHandler):
    """One request: a page file by fixed name, or the JSON API."""

    server_version = "explorer"

    def do_GET(self):
        if not self.host_allowed():
            return
        path = self.path.split("?")[0]
        if path == "/api/info":
            self.reply(200, self.server.explorer.info())
        elif path == "/api/steps":
            self.reply(200, self.server.explorer.steps())
        elif path == "/api/timeline":
            since = parse_qs(urlsplit(self.path).query).get("since", [None])[0]
            try:
                self.reply(200, self.server.explorer.timeline(since))
            except OSError as e:  # the run's folder unreadable: one line, the server goes on
                self.reply(500, {"error": f"cannot read the run's folder: {e}"})
        elif path in PAGE_FILES:
            name = PAGE_FILES[path]
            with open(os.path.join(PAGE_DIR, name), "rb") as f:
                data = f.read()
            kind = PAGE_TYPES[os.path.splitext(name)[1]]
            self.send(200, data, f"{kind}; charset=utf-8")
        else:
            self.reply(404, {"error": f"no page {path!r}; open / for the explorer"})

    def do_POST(self):
        if not self.host_allowed():
            return
        try:
            body = self.read_json()
            if self.path == "/api/analyze":
                self.reply(200, self.server.explorer.analyze(body))
            elif self.path == "/api/generate":
                ids, tokens = self.server.explorer.generate(body)
                self.stream(ids, tokens)
            elif self.path == "/api/patch":
                self.reply(200, self.server.explorer.patch(body))
            elif self.path == "/api/composition":
                self.reply(200, self.server.explorer.compose(body))
            else:
                message = (
                    f"no API {self.path!r}; use /api/analyze, /api/generate, /api/patch "
                    "or /api/composition"
                )
                self.reply(404, {"error": message})
        except RequestError as e:
            self.reply(400, {"error": str(e)})
        except Exception as e:  # a bug, or out of memory: one line, and the server goes on
            self.reply(
                500, {"error": f"the explorer failed on this request: {type(e).__name__}: {e}"}
            )

    def refuse(self):
        self.reply(405, {"error": f"{self.command} is not served; GET the page, POST to the API"})

    do_PUT = refuse
    do_DELETE = refuse
    do_PATCH = refuse
    do_OPTIONS = refuse

    def read_json(self):
        """The request body as JSON, or RequestError."""
        kind = self.headers.get("Content-Type", "").split(";")[0].strip()
        if kind != "application/json":
            raise RequestError("send the body as JSON with Content-Type: application/json")
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            raise RequestError("the request needs a Content-Length header")
        if int(length) > MAX_BODY:
            raise RequestError(f"the request body is over {MAX_BODY} bytes; send a shorter prompt")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise RequestError("the request body is not valid JSON") from None

    def stream(self, ids, tokens):
        """The new tokens as JSON lines (application/x-ndjson), sent as they come."""
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(self.line({"prompt_tokens": self.server.explorer.tok.token_strings(ids)}))
        try:
            for token in tokens:
                self.wfile.write(self.line(token))
                self.wfile.flush()
            self.wfile.write(self.line({"done": True}))
        except (BrokenPipeError, ConnectionResetError):
            # the tab stopped reading (its Stop button): end this generation quietly
            tokens.close()
        except Exception as e:  # the status line is sent: the error goes in the stream
            self.wfile.write(self.line({"error": f"generation failed: {type(e).__name__}: {e}"}))

    def line(self, obj):
        return (json.dumps(obj) + "\n").encode("utf-8")

    def reply(self, code, obj):
        self.send(code, json.dumps(obj, allow_nan=False).encode("utf-8"), "application/json")

    def send(self, code, data, kind):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        # the page's own files only: nothing fetched from elsewhere, no framing by other sites
        self.send_header(
            "Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:"
        )
        self.send_header("X-Frame-Options", "DENY")
        self.end_headers()
        self.wfile.write(data)

    def host_allowed(self):
        """A server on localhost answers only requests addressed to localhost: a web
        page elsewhere cannot reach it through a DNS name it rebinds to 127.0.0.1."""
        allowed = self.server.allowed_hosts
        host = self.headers.get("Host", "")
        if allowed is None or host in allowed:
            return True
        port = self.server.server_port
        message = f"Host {host!r} is not this server; open http://127.0.0.1:{port}/"
        self.reply(403, {"error": message})
        return False

    def log_message(self, format, *args):
        """Quiet: the terminal shows the address and errors, not every request."""


class ExplorerServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that knows its Explorer. Its threads are daemons, so
    Ctrl-C stops it at once, whatever a request is doing (explore.py then ends the
    process without the interpreter's shutdown, which torch would abort)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, explorer, host, port):
        if ":" in host:
            self.address_family = socket.AF_INET6  # an IPv6 address, as ::1
        super().__init__((host, port), Handler)
        self.explorer = explorer
        port = self.server_port
        loopback = host in ("127.0.0.1", "localhost", "::1")
        names = (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}")
        self.allowed_hosts = set(names) if loopback else None


def address(server):
    host = server.server_address[0]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{server.server_port}/"
