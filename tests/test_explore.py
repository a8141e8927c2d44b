"""explore.py and explorer/server.py: the attention explorer's API and server.

The API's numbers are checked against the model's own forward, its ablation
against c_proj's weight columns zeroed by hand and against heads.py's
head_measures.ablated, its labels against attention_maps and the induction
probe. The server is a real one on a free localhost port; the command is a
real process stopped with Ctrl-C (SIGINT).
"""

import dataclasses
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import ctrl_c_reaches_it, heads_zeroed, train_char_model

import explore
from explorer import server as explorer
from explorer.server import PAGE_DIR, Explorer, ExplorerServer, address
from model import GPT, GPTConfig
from support import attention_maps, head_measures
from support.checkpoint import checkpoint_path, save_checkpoint
from support.loading import load_model

BLOCK = 32
TIMEOUT = 60  # seconds: no request in these tests may hang the suite
PROMPT = "ROMEO:\nBut soft, what light thro"  # 32 characters: the whole context
_NAMES = "|".join(attention_maps.NAMES)
LABEL = re.compile(
    rf"^(induction|{_NAMES}|broad|other|weak ({_NAMES})|mixed: ({_NAMES})\+({_NAMES}))$"
)


# -----------------------------------------------------------------------------
# A small trained model, its checkpoint, and a server over it


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_path):
    """A checkpoint folder: a 2-layer, 64-wide char model after 80 AdamW steps."""
    with open(corpus_path, encoding="utf-8") as f:
        text = f.read()
    run = train_char_model(text, BLOCK, steps=80, batch_size=16, data_chars=200_000)
    model = run["model"]
    tok = run["tok"]
    config = run["config"]
    folder = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(
        {
            "model": model.state_dict(),
            "model_args": dataclasses.asdict(config),
            "iter_num": 80,
            "best_val_loss": run["loss"],
            "config": {},
            "tokenizer": tok.describe(),
            "dataset": "shakespeare_char",
        },
        checkpoint_path(folder),
    )
    model.eval()
    return {"dir": str(folder), "model": model, "tok": tok}


def serve(explorer):
    """A server on a free localhost port, in a thread; it stops itself after
    TIMEOUT * 5 seconds should the test never stop it."""
    server = ExplorerServer(explorer, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    guard = threading.Timer(TIMEOUT * 5, server.shutdown)
    guard.daemon = True
    guard.start()
    return server, guard


@pytest.fixture(scope="module")
def server(trained):
    server, guard = serve(Explorer(trained["model"], trained["tok"]))
    yield server
    guard.cancel()
    server.shutdown()
    server.server_close()


def request(server, method, path, body=None, headers=None, raw=None):
    """(status, parsed JSON or text) of one request to the server."""
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=TIMEOUT)
    sent = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = headers or ({"Content-Type": "application/json"} if sent is not None else {})
    conn.request(method, path, body=sent, headers=headers)
    response = conn.getresponse()
    data = response.read().decode("utf-8")
    conn.close()
    if response.getheader("Content-Type", "").startswith("application/json"):
        return response.status, json.loads(data)
    return response.status, data


def analyze(server, **body):
    status, answer = request(server, "POST", "/api/analyze", body)
    assert status == 200, answer
    return answer


# -----------------------------------------------------------------------------
# The oracles: the model's own forward, with heads removed by hand


@torch.no_grad()
def forward(model, tok, prompt):
    """(ids, maps, next-token probabilities, per-token loss) from the model directly."""
    idx = torch.tensor([tok.encode(prompt)])
    logits, maps = model.attention_maps(idx)
    loss = model(idx[:, :-1], idx[:, 1:])[1]  # the model's own mean loss, as a check
    token_loss = F.cross_entropy(logits[0, :-1], idx[0, 1:], reduction="none")
    assert token_loss.mean().item() == pytest.approx(loss.item(), abs=1e-5)
    return idx, maps, F.softmax(logits[0, -1], dim=-1), token_loss


def check_equal(answer, model, tok, prompt):
    idx, maps, probs, token_loss = forward(model, tok, prompt)
    assert answer["tokens"] == [tok.decode([i]) for i in idx[0].tolist()]
    for layer, m in enumerate(maps):
        got = torch.tensor(answer["attention"][layer])
        assert got.shape == m[0].shape  # (n_head, T, T)
        torch.testing.assert_close(got, m[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(answer["token_loss"]), token_loss, atol=1e-5, rtol=0)
    top = torch.topk(probs, 10)
    assert [n["token"] for n in answer["next"]] == [tok.decode([i]) for i in top.indices.tolist()]
    torch.testing.assert_close(
        torch.tensor([n["prob"] for n in answer["next"]]), top.values, atol=1e-5, rtol=0
    )
    greedy = model.generate(idx, len(answer["continuation"]), temperature=0.0)
    assert "".join(answer["continuation"]) == tok.decode(greedy[0, idx.size(1) :].tolist())


# -----------------------------------------------------------------------------
# The API equals the model


def test_analyze_equals_the_model_forward(server, trained):
    answer = analyze(server, prompt=PROMPT)
    assert "intact" not in answer  # nothing ablated: one model
    assert len(answer["continuation"]) == 20
    check_equal(answer, trained["model"], trained["tok"], PROMPT)


@pytest.mark.parametrize("heads", [[[1, 2]], [[0, 0], [1, 3]]])
def test_ablation_equals_heads_py_and_columns_zeroed(server, trained, heads):
    model, tok = trained["model"], trained["tok"]
    answer = analyze(server, prompt=PROMPT, ablate=heads)
    assert answer["ablate"] == heads
    check_equal(answer, heads_zeroed(model, heads), tok, PROMPT)  # removed another way
    check_equal(answer["intact"], model, tok, PROMPT)
    with head_measures.ablated(model, [tuple(h) for h in heads]):  # heads.py's own ablation
        check_equal(answer, model, tok, PROMPT)
    # the effect is there to see: the probabilities moved
    before = {n["token"]: n["prob"] for n in answer["intact"]["next"]}
    after = {n["token"]: n["prob"] for n in answer["next"]}
    assert max(abs(after[t] - before[t]) for t in before.keys() & after.keys()) > 1e-3


def test_labels_follow_the_rule_of_heads_py(server, trained):
    model, tok = trained["model"], trained["tok"]
    answer = analyze(server, prompt=PROMPT, continuation=0)
    assert answer["continuation"] == []
    _, maps, _, _ = forward(model, tok, PROMPT)
    stats = attention_maps.all_head_stats(
        [m[0].numpy() for m in maps], tok.token_strings(tok.encode(PROMPT))
    )
    probe = head_measures.induction_scores(model, 1337)["induction"]
    for s in stats:
        got = answer["labels"][s["layer"]][s["head"]]
        assert LABEL.match(got["label"]), got
        score = probe[s["layer"], s["head"]]
        assert got["induction"] == pytest.approx(score, abs=1e-4)
        want = "induction" if score >= head_measures.INDUCTION else s["label"]
        assert got["label"] == want
        assert got["pattern"] == s["label"]
        assert got["scores"] == s["scores"]


def stream(server, body):
    """The JSON lines of one /api/generate."""
    status, text = request(server, "POST", "/api/generate", body)
    assert status == 200, text
    return [json.loads(line) for line in text.splitlines()]


def test_generate_samples_as_the_model_does(server, trained):
    model, tok = trained["model"], trained["tok"]
    body = {"prompt": PROMPT, "max_new_tokens": 40, "temperature": 0.9, "top_k": 20, "seed": 5}
    lines = stream(server, body)
    assert lines[0]["prompt_tokens"] == list(PROMPT)
    assert lines[-1] == {"done": True}
    idx = torch.tensor([tok.encode(PROMPT)])
    gen = torch.Generator().manual_seed(5)
    want = model.generate(idx, 40, temperature=0.9, top_k=20, generator=gen)[0, idx.size(1) :]
    assert [line["id"] for line in lines[1:-1]] == want.tolist()
    # greedy generation with heads off is the analysis' greedy continuation
    heads = [[0, 1]]
    greedy = stream(
        server, {"prompt": PROMPT, "max_new_tokens": 20, "temperature": 0, "ablate": heads}
    )
    answer = analyze(server, prompt=PROMPT, ablate=heads)
    assert [line["token"] for line in greedy[1:-1]] == answer["continuation"]


def test_a_hugging_face_gpt2_folder(tmp_path):
    """--init_from a GPT-2 folder: BPE tokens, the same numbers as the weights in memory."""
    # pytest puts tests/ on the path: the helper that writes Hugging Face's files
    from test_sample import write_hf_gpt2

    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=64, vocab_size=50257, n_layer=1, n_head=2, n_embd=16)).eval()
    write_hf_gpt2(model, str(tmp_path))
    loaded, tok, _ = load_model(str(tmp_path), "")
    server, guard = serve(Explorer(loaded.eval(), tok))
    try:
        prompt = "Hello, world. Hello,"
        answer = analyze(server, prompt=prompt, ablate=[[0, 1]], continuation=5)
        assert answer["tokens"] == ["Hello", ",", " world", ".", " Hello", ","]
        check_equal(answer, heads_zeroed(model, [[0, 1]]), tok, prompt)
        check_equal(answer["intact"], model, tok, prompt)
    finally:
        guard.cancel()
        server.shutdown()
        server.server_close()


def test_a_model_too_small_for_the_induction_probe_is_one_line(tmp_path, capsys):
    """The labels need heads.py's induction probe, which needs 4 tokens of context: a
    model of 3 gets one line and exit 2 before anything is served (it was a traceback)."""
    from test_sample import write_hf_gpt2

    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=3, vocab_size=50257, n_layer=1, n_head=2, n_embd=16)).eval()
    write_hf_gpt2(model, str(tmp_path))
    code = explore.run([f"--init_from={tmp_path}", "--port=0"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.strip() == (
        "error: the induction probe needs block_size >= 4 and vocab_size >= 3 "
        "(this model has 3 and 50257)"
    )


# -----------------------------------------------------------------------------
# Bad requests: a 4xx with one line, and the server goes on


def bad_requests():
    """name -> (method, path, body, raw bytes or None, headers or None, status, words)."""
    json_type = {"Content-Type": "application/json"}
    long_prompt = "to be or not " * 10  # 130 characters, over the context of 32
    return {
        "not_json": ("POST", "/api/analyze", None, b"{prompt:", json_type, 400, "not valid JSON"),
        "not_utf8": ("POST", "/api/analyze", None, b"\xff\xfe", json_type, 400, "not valid JSON"),
        "not_object": ("POST", "/api/analyze", [1, 2], None, None, 400, "JSON object"),
        "unknown_field": (
            "POST",
            "/api/analyze",
            {"prompt": "a", "promt": 1},
            None,
            None,
            400,
            "'promt'",
        ),
        "layer_range": (
            "POST",
            "/api/analyze",
            {"prompt": "ab", "ablate": [[2, 0]]},
            None,
            None,
            400,
            "layer 2",
        ),
        "head_range": (
            "POST",
            "/api/analyze",
            {"prompt": "ab", "ablate": [[0, -1]]},
            None,
            None,
            400,
            "head -1",
        ),
        "ablate_shape": (
            "POST",
            "/api/analyze",
            {"prompt": "ab", "ablate": [1, 2]},
            None,
            None,
            400,
            "pairs",
        ),
        "ablate_type": (
            "POST",
            "/api/analyze",
            {"prompt": "ab", "ablate": "0,1"},
            None,
            None,
            400,
            "list",
        ),
        "empty_prompt": ("POST", "/api/analyze", {"prompt": ""}, None, None, 400, "non-empty"),
        "no_prompt": ("POST", "/api/analyze", {}, None, None, 400, "prompt"),
        "prompt_type": ("POST", "/api/analyze", {"prompt": 42}, None, None, 400, "string"),
        "too_long": (
            "POST",
            "/api/analyze",
            {"prompt": long_prompt},
            None,
            None,
            400,
            "context of 32",
        ),
        "bad_char": ("POST", "/api/analyze", {"prompt": "Café"}, None, None, 400, "'é'"),
        "continuation": (
            "POST",
            "/api/analyze",
            {"prompt": "a", "continuation": 10**6},
            None,
            None,
            400,
            "continuation",
        ),
        "absurd_length": (
            "POST",
            "/api/generate",
            {"prompt": "a", "max_new_tokens": 10**9},
            None,
            None,
            400,
            "max_new_tokens",
        ),
        "zero_length": (
            "POST",
            "/api/generate",
            {"prompt": "a", "max_new_tokens": 0},
            None,
            None,
            400,
            "max_new_tokens",
        ),
        "temperature": (
            "POST",
            "/api/generate",
            {"prompt": "a", "temperature": -1},
            None,
            None,
            400,
            "temperature",
        ),
        "top_k": (
            "POST",
            "/api/generate",
            {"prompt": "a", "top_k": "all"},
            None,
            None,
            400,
            "top_k",
        ),
        "gen_unknown": (
            "POST",
            "/api/generate",
            {"prompt": "a", "file": "/etc/passwd"},
            None,
            None,
            400,
            "'file'",
        ),
        "form_post": (
            "POST",
            "/api/analyze",
            None,
            b"prompt=a",
            {"Content-Type": "text/plain"},
            400,
            "Content-Type",
        ),
        "huge_body": (
            "POST",
            "/api/analyze",
            None,
            b"{}",
            {"Content-Type": "application/json", "Content-Length": str(10**9)},
            400,
            "bytes",
        ),
        "no_api": ("POST", "/api/train", {"prompt": "a"}, None, None, 404, "/api/analyze"),
        "traversal": ("GET", "/../model.py", None, None, None, 404, "no page"),
        "encoded_traversal": ("GET", "/%2e%2e/%2e%2e/etc/passwd", None, None, None, 404, "no page"),
        "a_file": ("GET", "/explorer.py", None, None, None, 404, "no page"),
        "put": ("PUT", "/api/analyze", {"prompt": "a"}, None, None, 405, "not served"),
        "rebinding": (
            "GET",
            "/",
            None,
            None,
            {"Host": "attacker.example:80"},
            403,
            "not this server",
        ),
    }


@pytest.mark.parametrize("name", sorted(bad_requests()))
def test_bad_request_gets_a_4xx_line_and_the_server_goes_on(server, name):
    method, path, body, raw, headers, status, words = bad_requests()[name]
    got, answer = request(server, method, path, body, headers, raw)
    assert got == status
    assert set(answer) == {"error"}
    assert words in answer["error"]
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
    assert analyze(server, prompt="ab", continuation=0)["tokens"] == ["a", "b"]


def ipv6_loopback():
    """Whether this machine can listen on ::1 (a container may have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_ipv6_loopback_is_served_as_localhost(trained):
    # explore.py names ::1 as loopback; the server bound IPv4 sockets only
    server = ExplorerServer(Explorer(trained["model"], trained["tok"]), "::1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert address(server) == f"http://[::1]:{server.server_port}/"
        conn = http.client.HTTPConnection("::1", server.server_port, timeout=TIMEOUT)
        conn.request("GET", "/api/info")  # its Host header: [::1]:port
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["n_layer"] == trained["model"].config.n_layer
        conn.close()
    finally:
        server.shutdown()
        server.server_close()


def test_maps_too_large_for_an_answer_are_refused(server, monkeypatch):
    """A large model's long prompt: one line, before any forward (here 8 heads, 20 tokens)."""
    monkeypatch.setattr(explorer, "MAX_WEIGHTS", 8 * 20 * 20)
    status, answer = request(server, "POST", "/api/analyze", {"prompt": PROMPT[:21]})
    assert status == 400 and "up to 20 tokens" in answer["error"]
    assert analyze(server, prompt=PROMPT[:20], continuation=0)["tokens"] == list(PROMPT[:20])


def test_the_page_is_served_and_fetches_nothing_from_outside(server):
    status, html = request(server, "GET", "/")
    assert status == 200
    for name in ("explorer.js", "panels.js", "timeline.js"):
        assert f'src="{name}"' in html
    for name in ("explorer.js", "panels.js", "timeline.js", "explorer.css"):
        status, text = request(server, "GET", "/" + name)
        assert status == 200
        assert text == open(os.path.join(PAGE_DIR, name), encoding="utf-8").read()
        assert "://" not in text and "@import" not in text
    assert "://" not in html


@pytest.mark.parametrize(
    "path, kind",
    [("/", "text/html"), ("/panels.js", "text/javascript"), ("/explorer.css", "text/css")],
)
def test_each_page_file_is_sent_with_its_type(server, path, kind):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=TIMEOUT)
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.getheader("Content-Type") == f"{kind}; charset=utf-8"


# -----------------------------------------------------------------------------
# Several tabs at once


def test_ten_concurrent_requests_are_answered_correctly(server, trained):
    prompts = [PROMPT[: 10 + 2 * k] for k in range(10)]
    ablations = [[[k % 2, k % 4]] if k % 3 else [] for k in range(10)]
    alone = [analyze(server, prompt=p, ablate=a) for p, a in zip(prompts, ablations)]
    together = [None] * 10
    barrier = threading.Barrier(10, timeout=TIMEOUT)

    def ask(k):
        barrier.wait()
        together[k] = analyze(server, prompt=prompts[k], ablate=ablations[k])

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(10)]
    for t in threads:
        t.start()
    # a generation runs beside them, token by token, with its own heads off
    lines = stream(
        server, {"prompt": PROMPT, "max_new_tokens": 30, "temperature": 0, "ablate": [[1, 1]]}
    )
    for t in threads:
        t.join(TIMEOUT)
    assert together == alone
    with head_measures.ablated(trained["model"], [(1, 1)]):
        idx = torch.tensor([trained["tok"].encode(PROMPT)])
        want = trained["model"].generate(idx, 30, temperature=0.0)[0, idx.size(1) :]
    assert [line["id"] for line in lines[1:-1]] == want.tolist()


# -----------------------------------------------------------------------------
# The command


def start(repo_root, *argv):
    return subprocess.Popen(
        [sys.executable, "explore.py", *argv],
        cwd=repo_root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=ctrl_c_reaches_it,
    )


def test_command_serves_and_stops_at_ctrl_c(trained, repo_root):
    proc = start(repo_root, f"--out_dir={trained['dir']}", "--port=0")
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        match = re.search(r"explorer at http://127\.0\.0\.1:(\d+)/", lines[1])
        assert match, lines
        conn = http.client.HTTPConnection("127.0.0.1", int(match[1]), timeout=TIMEOUT)
        conn.request("GET", "/api/info")
        info = json.loads(conn.getresponse().read())
        assert (info["n_layer"], info["n_head"], info["context"]) == (2, 4, BLOCK)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.communicate()


def test_ctrl_c_during_a_generation_stops_cleanly(trained, repo_root):
    """Ctrl-C while a request's thread is inside torch: the interpreter's shutdown
    would stop that thread there, and torch would abort the process (SIGABRT,
    "terminate called without an active exception"); the explorer exits 0."""
    proc = start(repo_root, f"--out_dir={trained['dir']}", "--port=0")
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        port = int(re.search(r"127\.0\.0\.1:(\d+)/", lines[1])[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        body = json.dumps({"prompt": PROMPT, "max_new_tokens": explorer.MAX_NEW_TOKENS})
        conn.request("POST", "/api/generate", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        first_tokens = [json.loads(answer.readline()) for _ in range(3)]
        assert "id" in first_tokens[-1]  # the generation is under way
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        _, err = proc.communicate()
        assert err.strip() == "stopped"
    finally:
        proc.kill()
        proc.communicate()


def test_command_help_lists_the_options(repo_root):
    proc = start(repo_root, "--help")
    out, _ = proc.communicate(timeout=TIMEOUT)
    for key in ("--out_dir", "--init_from", "--host", "--port", "--device", "--dtype"):
        assert key in out
