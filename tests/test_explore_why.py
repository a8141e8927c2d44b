"""The explorer's answers to "why this token?" and "which heads carry the difference?",
and its steps through a training run: the logit lens and the attribution in
/api/analyze, /api/patch, /api/steps and "step", through a real server.

Oracles: the model's own forward (its logits, the model cut after each block), one
full forward per patched head with a hook of the test's own, and the snapshot's model
loaded and run directly.
"""

import copy
import dataclasses

import numpy as np
import pytest
import torch

# pytest puts tests/ on the path: the trained model and the server helpers of the API's tests
from test_explore import PROMPT, analyze, request, serve, trained  # noqa: F401 (a fixture)
from test_interpret import cut_after, one_head_patched

from explorer import interpret
from explorer.server import Explorer
from support import composition, head_measures, timeline
from support.checkpoint import checkpoint_path, save_checkpoint

CLEAN = "ROMEO:\nBut soft, what light thro"
CORRUPT = "JULIET:\nBut soft, what light thr"  # the same number of characters


@pytest.fixture(scope="module")
def server(trained):  # noqa: F811
    server, guard = serve(Explorer(trained["model"], trained["tok"]))
    yield server
    guard.cancel()
    server.shutdown()
    server.server_close()


def ids_of(tok, text):
    return torch.tensor([tok.encode(text)])


# -----------------------------------------------------------------------------
# The logit lens and the attribution in /api/analyze


def test_lens_is_the_model_cut_after_each_block_and_ends_at_its_prediction(server, trained):  # noqa: F811
    model, tok = trained["model"], trained["tok"]
    answer = analyze(server, prompt=PROMPT, continuation=0)
    lens = answer["logit_lens"]
    T = len(answer["tokens"])
    assert len(lens) == model.config.n_layer + 1
    assert all(len(point) == T and all(len(cell) == 5 for cell in point) for point in lens)
    idx = ids_of(tok, PROMPT)
    for point in range(model.config.n_layer + 1):
        with torch.no_grad():
            probs = torch.softmax(cut_after(model, point)(idx)[0][0], dim=-1)  # (T, vocab)
        top = torch.topk(probs, 5)
        got_ids = [[cell["id"] for cell in row] for row in lens[point]]
        assert got_ids == top.indices.tolist()
        got = torch.tensor([[cell["prob"] for cell in row] for row in lens[point]])
        torch.testing.assert_close(got, top.values, atol=1e-5, rtol=0)
        assert lens[point][0][0]["token"] == tok.decode([top.indices[0, 0].item()])
    # the last point is the model's own prediction: the answer's next-token top 5
    assert [c["id"] for c in lens[-1][-1]] == [n["id"] for n in answer["next"][:5]]


def parts_sum(a):
    return a["embed"] + a["bias"] + sum(map(sum, a["heads"])) + sum(a["mlp"])


def test_attribution_sums_to_the_models_logit(server, trained):  # noqa: F811
    model, tok = trained["model"], trained["tok"]
    c = model.config
    idx = ids_of(tok, PROMPT)
    with torch.no_grad():
        logits = model(idx)[0][0]  # (T, vocab)
    answer = analyze(server, prompt=PROMPT, continuation=0)
    a = answer["attribution"]
    T = idx.size(1)
    # the default: the last position and the model's most likely next token
    assert (a["position"], a["id"]) == (T - 1, answer["next"][0]["id"])
    assert a["token"] == answer["next"][0]["token"]
    assert len(a["heads"]) == c.n_layer and all(len(row) == c.n_head for row in a["heads"])
    assert len(a["mlp"]) == c.n_layer
    assert a["logit"] == pytest.approx(logits[T - 1, a["id"]].item(), abs=1e-5)
    assert parts_sum(a) == pytest.approx(a["logit"], abs=1e-4)
    # every prompt token after the first, at the position before it
    every = answer["token_attribution"]
    assert [e["position"] for e in every] == list(range(T - 1))
    assert [e["id"] for e in every] == idx[0, 1:].tolist()
    for e in every:
        assert e["logit"] == pytest.approx(logits[e["position"], e["id"]].item(), abs=1e-5)
        assert parts_sum(e) == pytest.approx(e["logit"], abs=1e-4)
    # a position and token asked for
    asked = analyze(server, prompt=PROMPT, continuation=0, attribute={"position": 3, "token": 7})
    b = asked["attribution"]
    assert (b["position"], b["id"]) == (3, 7)
    assert b["logit"] == pytest.approx(logits[3, 7].item(), abs=1e-5)
    assert parts_sum(b) == pytest.approx(b["logit"], abs=1e-4)


def test_a_head_switched_off_has_no_part(server, trained):  # noqa: F811
    answer = analyze(server, prompt=PROMPT, continuation=0, ablate=[[1, 2]])
    assert answer["attribution"]["heads"][1][2] == 0.0
    assert answer["intact"]["attribution"]["heads"][1][2] != 0.0
    assert parts_sum(answer["attribution"]) == pytest.approx(
        answer["attribution"]["logit"], abs=1e-4
    )


# -----------------------------------------------------------------------------
# /api/patch


def patch(server, **body):
    status, answer = request(server, "POST", "/api/patch", body)
    assert status == 200, answer
    return answer


def test_patch_equals_one_full_forward_per_head(server, trained):  # noqa: F811
    model, tok = trained["model"], trained["tok"]
    target, foil = tok.encode("o")[0], tok.encode("u")[0]
    answer = patch(server, clean=CLEAN, corrupt=CORRUPT, target="o", foil=foil)
    assert answer["target"] == {"token": "o", "id": target}
    assert answer["foil"] == {"token": "u", "id": foil}
    clean, corrupt = ids_of(tok, CLEAN), ids_of(tok, CORRUPT)
    with torch.no_grad():
        clean_logits = model(clean)[0][0, -1]
        corrupt_logits = model(corrupt)[0][0, -1]
    clean_diff = (clean_logits[target] - clean_logits[foil]).item()
    corrupt_diff = (corrupt_logits[target] - corrupt_logits[foil]).item()
    assert answer["clean_diff"] == pytest.approx(clean_diff, abs=1e-5)
    assert answer["corrupt_diff"] == pytest.approx(corrupt_diff, abs=1e-5)
    for layer in range(model.config.n_layer):
        for head in range(model.config.n_head):
            want = one_head_patched(model, clean, corrupt, layer, head, target, foil)
            assert answer["patched"][layer][head] == pytest.approx(want, abs=1e-5)
            restored = (want - corrupt_diff) / (clean_diff - corrupt_diff)
            assert answer["heads"][layer][head] == pytest.approx(restored, abs=1e-4)


def test_patch_with_heads_off_keeps_them_off(server, trained):  # noqa: F811
    model, tok = trained["model"], trained["tok"]
    answer = patch(server, clean=CLEAN, corrupt=CORRUPT, target=5, foil=9, ablate=[[0, 1]])
    # an ablated head carries nothing from either run
    assert answer["heads"][0][1] == pytest.approx(0.0, abs=1e-5)
    with head_measures.ablated(model, [(0, 1)]):
        want = interpret.patch_heads(model, ids_of(tok, CLEAN), ids_of(tok, CORRUPT), 5, 9)
    torch.testing.assert_close(torch.tensor(answer["patched"]), want["patched"], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"clean": CLEAN, "corrupt": CORRUPT[:-1], "target": 1, "foil": 2}, "same token length"),
        ({"clean": CLEAN, "corrupt": CORRUPT, "target": 1, "foil": 1}, "same token"),
        ({"clean": CLEAN, "corrupt": CLEAN, "target": 1, "foil": 2}, "mostly rounding"),
        ({"clean": CLEAN, "corrupt": CORRUPT, "target": "ab", "foil": 2}, "2 tokens"),
        ({"clean": CLEAN, "corrupt": CORRUPT, "target": 10**6, "foil": 2}, "target must be"),
        ({"clean": CLEAN, "corrupt": CORRUPT, "foil": 2}, "target must be"),
        ({"clean": "", "corrupt": CORRUPT, "target": 1, "foil": 2}, "clean must be"),
        ({"clean": CLEAN, "corrupt": CORRUPT, "target": 1, "foil": 2, "x": 0}, "'x'"),
        ({"clean": CLEAN, "corrupt": CORRUPT, "target": "é", "foil": 2}, "'é'"),
        ({"clean": CLEAN, "corrupt": CORRUPT, "target": 1, "foil": 2, "step": 5}, "without steps"),
    ],
)
def test_bad_patch_requests_get_a_4xx_line(server, body, words):
    status, answer = request(server, "POST", "/api/patch", body)
    assert status == 400 and set(answer) == {"error"}
    assert words in answer["error"] and "\n" not in answer["error"]


@pytest.mark.parametrize(
    "attribute, words",
    [
        ({"position": 99}, "position must be"),
        ({"token": -1}, "token must be"),
        ({"where": 1}, "attribute must be"),
        ([1, 2], "attribute must be"),
    ],
)
def test_bad_attribute_gets_a_4xx_line(server, attribute, words):
    body = {"prompt": PROMPT, "attribute": attribute}
    status, answer = request(server, "POST", "/api/analyze", body)
    assert status == 400 and words in answer["error"]


# -----------------------------------------------------------------------------
# Steps: the snapshots of a training run


@pytest.fixture(scope="module")
def run_dir(trained, tmp_path_factory):  # noqa: F811
    """A run's folder: ckpt.pt at iter 80 (the trained model) and snapshots at iters 40
    (another model: the trained one, moved) and 80."""
    folder = tmp_path_factory.mktemp("run")
    model, tok = trained["model"], trained["tok"]
    earlier = copy.deepcopy(model)
    with torch.no_grad():
        for p in earlier.parameters():
            p.mul_(0.7)
    for iter_num, m in ((40, earlier), (80, model)):
        snapshot = {
            "model": m.state_dict(),
            "model_args": dataclasses.asdict(m.config),
            "iter_num": iter_num,
            "tokenizer": tok.describe(),
            "dataset": "shakespeare_char",
        }
        save_checkpoint(snapshot, timeline.snapshot_path(str(folder), iter_num))
        if iter_num == 80:
            save_checkpoint(snapshot, checkpoint_path(str(folder)))
    return {"dir": str(folder), "earlier": earlier.eval()}


def test_steps_are_the_snapshots_and_each_answers_as_its_model(trained, run_dir):  # noqa: F811
    model, tok = trained["model"], trained["tok"]
    folder = run_dir["dir"]
    server, guard = serve(Explorer(model, tok, folder, timeline.checkpoint_step(folder)))
    try:
        status, steps = request(server, "GET", "/api/steps")
        assert status == 200
        assert steps == {"steps": [40, 80], "checkpoint": 80}
        idx = ids_of(tok, PROMPT)
        for step, m in ((40, run_dir["earlier"]), (80, model), (None, model)):
            body = {"prompt": PROMPT, "continuation": 0}
            if step is not None:
                body["step"] = step
            answer = analyze(server, **body)
            assert answer["step"] == (step or 80)
            with torch.no_grad():
                probs = torch.softmax(m(idx)[0][0, -1], dim=-1)
            want = torch.topk(probs, 10)
            assert [n["id"] for n in answer["next"]] == want.indices.tolist()
        # generation and patching at a step are the snapshot's
        status, text = request(
            server,
            "POST",
            "/api/generate",
            {"prompt": PROMPT, "max_new_tokens": 8, "temperature": 0, "step": 40},
        )
        assert status == 200
        lines = [line for line in text.splitlines() if '"id"' in line]
        greedy = run_dir["earlier"].generate(idx, 8, temperature=0.0)[0, idx.size(1) :]
        assert [int(line.split('"id": ')[1].rstrip("}")) for line in lines] == greedy.tolist()
        answer = patch(server, clean=CLEAN, corrupt=CORRUPT, target=5, foil=9, step=40)
        want = interpret.patch_heads(
            run_dir["earlier"], ids_of(tok, CLEAN), ids_of(tok, CORRUPT), 5, 9
        )
        torch.testing.assert_close(
            torch.tensor(answer["patched"]), want["patched"], atol=1e-5, rtol=0
        )
        status, answer = request(server, "POST", "/api/analyze", {"prompt": "a", "step": 41})
        assert status == 400 and "no snapshot at step 41" in answer["error"]
        # a step that is no number is the same one line (it was a 500: unhashable type)
        for path in ("/api/analyze", "/api/generate", "/api/patch", "/api/composition"):
            for step in ([40], {"step": 40}, 40.0, "40"):
                status, answer = request(server, "POST", path, {"step": step})
                assert status == 400 and f"no snapshot at step {step!r}" in answer["error"], (
                    path,
                    answer,
                )
    finally:
        guard.cancel()
        server.shutdown()
        server.server_close()


# -----------------------------------------------------------------------------
# The token to explain as a string; a difference too small to normalise


def test_attribute_token_as_a_one_token_string_is_its_id(server, trained):  # noqa: F811
    tok = trained["tok"]
    by_id = analyze(server, prompt=PROMPT, continuation=0, attribute={"token": tok.encode("e")[0]})
    by_string = analyze(server, prompt=PROMPT, continuation=0, attribute={"token": "e"})
    assert by_string["attribution"] == by_id["attribution"]
    assert by_string["attribution"]["token"] == "e"
    status, answer = request(
        server, "POST", "/api/analyze", {"prompt": PROMPT, "attribute": {"token": "ab"}}
    )
    assert status == 400 and "attribute.token 'ab' is 2 tokens" in answer["error"]


def test_a_difference_too_small_to_normalise_is_refused(trained):  # noqa: F811
    """Every head off but L0 H0, whose output is scaled down: the clean - corrupt
    difference is then that head's alone, as small as the scale makes it. Under ten
    roundings of the logits it is refused, in one line that gives the threshold; well
    above, answered. The prompts differ in their first word only, so that the last
    position sees the difference through the heads alone."""
    model, tok = trained["model"], trained["tok"]
    clean, corrupt = CLEAN, "JULIA" + CLEAN[5:]
    c = model.config
    others = [[layer, head] for layer in range(c.n_layer) for head in range(c.n_head)]
    others.remove([0, 0])
    body = {"clean": clean, "corrupt": corrupt, "target": "o", "foil": "u", "ablate": others}
    hs = c.n_embd // c.n_head

    def with_head_scaled(scale):
        edited = copy.deepcopy(model)
        with torch.no_grad():
            edited.transformer.h[0].attn.c_proj.weight[:, :hs] *= scale
        return edited

    def gap_and_threshold(m):
        """The difference and the threshold, from the model's own forward."""
        logits = []
        with head_measures.ablated(m, [tuple(h) for h in others]), torch.no_grad():
            for text in (clean, corrupt):
                logits.append(m(ids_of(tok, text))[0][0, -1])
        target, foil = tok.encode("o")[0], tok.encode("u")[0]
        gap = (logits[0][target] - logits[0][foil]) - (logits[1][target] - logits[1][foil])
        scale = max(x.abs().max().item() for x in logits)
        return abs(gap.item()), 10 * torch.finfo(torch.float32).eps * max(1.0, scale)

    full, threshold = gap_and_threshold(model)
    # so small a gap is a few roundings of the logits, and how many depends on the
    # CPU's arithmetic: the first scale whose gap lies above what the check used to
    # refuse (1e-6) and below the threshold
    for fraction in (1 / 3, 1 / 2, 2 / 3, 0.8, 0.9):
        small = with_head_scaled(fraction * threshold / full)
        tiny_gap, small_threshold = gap_and_threshold(small)
        if 1e-6 < tiny_gap < small_threshold:
            break
    assert 1e-6 < tiny_gap < small_threshold
    server, guard = serve(Explorer(small.eval(), tok))
    try:
        status, answer = request(server, "POST", "/api/patch", body)
        assert status == 400 and set(answer) == {"error"} and "\n" not in answer["error"]
        assert f"under {small_threshold:.3g}" in answer["error"]
        assert "10 times the rounding of float32 logits" in answer["error"]
    finally:
        guard.cancel()
        server.shutdown()
        server.server_close()
    large = with_head_scaled(30 * threshold / full)
    assert gap_and_threshold(large)[0] > gap_and_threshold(large)[1]
    server, guard = serve(Explorer(large.eval(), tok))
    try:
        status, answer = request(server, "POST", "/api/patch", body)
        assert status == 200, answer
        # the one head carries the whole difference
        assert answer["heads"][0][0] == pytest.approx(1.0, abs=1e-3)
    finally:
        guard.cancel()
        server.shutdown()
        server.server_close()


# -----------------------------------------------------------------------------
# Composition


def test_composition_is_support_composition_of_the_model_at_each_step(trained, run_dir):  # noqa: F811
    model, tok = trained["model"], trained["tok"]
    folder = run_dir["dir"]
    server, guard = serve(Explorer(model, tok, folder, step=80))
    try:
        for step, m in ((None, model), (40, run_dir["earlier"])):
            body = {} if step is None else {"step": step}
            status, answer = request(server, "POST", "/api/composition", body)
            assert status == 200, answer
            assert answer["step"] == (step or 80)
            want = composition.composition_scores(m)
            for kind in ("q", "k", "v"):
                got = np.array(answer[kind], dtype=np.float64)  # null -> nan
                np.testing.assert_array_equal(np.isnan(got), torch.isnan(want[kind]).numpy())
                np.testing.assert_allclose(got, want[kind].numpy(), atol=1e-6, rtol=0)
        # heads switched off do not enter: the scores are the weights'
        status, answer = request(server, "POST", "/api/composition", {"ablate": [[0, 1]]})
        assert status == 400 and "unknown field 'ablate'" in answer["error"]
    finally:
        guard.cancel()
        server.shutdown()
        server.server_close()
