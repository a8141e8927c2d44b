"""tests/test_invariants.py against edits of model.py whose verdict is known: changes of the
formula that a causal decoder may make (ALiBi, scores / d, a window) keep every
invariant, and bugs (the future seen, heads or sequences that mix) fail the one they
break, on the path they reach. Each edit is made to a copy of model.py's source, loaded
as a module of its own, and the invariants' own checks run on it."""

import importlib.util
import os

import pytest
import test_invariants as invariants

MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model.py")
SCORES = "    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., Tq, Tk)\n"
# ALiBi (Press et al. 2022) as a forker writes it inside attention(): minus a slope per
# head (2^(-8 h / nh)) times the distance from the query, which is the last of the keys
ALIBI = SCORES + (
    "    t_q, t_k = scores.shape[-2:]\n"
    "    nh = q.size(-3) if q.dim() == 4 else 1\n"
    "    slopes = 2.0 ** (-8.0 * torch.arange(1, nh + 1, device=q.device) / nh)\n"
    "    i = torch.arange(t_k - t_q, t_k, device=q.device)[:, None]\n"
    "    j = torch.arange(t_k, device=q.device)\n"
    "    scores = scores - slopes[:, None, None] * (i - j).clamp(min=0)\n"
)
MASK = '        scores = scores.masked_fill(~mask, float("-inf"))\n'
WINDOW = "    return visible(i, j, window, sinks)  # (t_q, t_k)\n"
IS_CAUSAL = "        is_causal = mask is None and q.size(2) == k.size(2)\n"
EDITS = {
    # legitimate: attention's formula changed
    "ALiBi": (SCORES, ALIBI),
    "scores / d": (SCORES, SCORES.replace("math.sqrt(d)", "d")),
    "a window of 4 in causal_mask": (WINDOW, WINDOW.replace("window,", "window or 4,")),
    # bugs
    "no mask in attention()": (MASK, "        pass\n"),
    "no causal flag for the fused kernel": (IS_CAUSAL, "        is_causal = False\n"),
    "heads share their scores": (SCORES, SCORES + "    scores = scores.mean(-3, True)\n"),
    "sequences share their scores": (SCORES, SCORES + "    scores = scores - scores.mean(0)\n"),
}
CHECKS = {
    "causal": invariants.check_causal,
    "cache": invariants.check_cache,
    "decode step": invariants.check_decode_step,
    "batch": invariants.check_batch,
    "heads": invariants.check_heads,
}
# the configurations with a full-attention cache (not the sliding window's rolling one)
FULL = ("gpt2", "recipe", "grouped-query", "kv shift")
# the invariants each edit breaks: (path, check, config), each a name, several, or None
# for all of them
BREAKS = {
    # the rolling cache holds the keys in slot order: attention() reads their distances
    # wrong, and the cached logits part from the full forward's
    "ALiBi": [("fused=False", "cache", "sliding window")],
    "scores / d": [],
    # causal_mask() makes every mask but the decode step's, which is its own; and the
    # mask of a chunk after cached positions on either path, so that a fused model's
    # chunk sees the window its full forward does not
    "a window of 4 in causal_mask": [
        ("fused=False", "decode step", None),
        ("fused=True", "cache", FULL),
    ],
    "no mask in attention()": [("fused=False", ("causal", "cache", "decode step"), None)],
    # the sliding window's own kernel (windowed_attention) makes its mask itself
    "no causal flag for the fused kernel": [("fused=True", ("causal", "cache"), FULL)],
    "heads share their scores": [("fused=False", "heads", None)],
    "sequences share their scores": [("fused=False", "batch", None)],
}


def edited_model(tmp_path, old, new):
    """model.py with `old` replaced by `new`, as a module of its own."""
    with open(MODEL) as f:
        source = f.read()
    assert source.count(old) == 1, f"model.py no longer has the line this edit changes: {old}"
    path = tmp_path / "edited_model.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("edited_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def failures(module):
    """{(path, check, config): whether it failed} for every invariant test."""
    failed = {}
    for path, fused in invariants.PATHS.items():
        for config, options in invariants.CONFIGS.items():
            for check, run in CHECKS.items():
                # as test_invariants.py: on fused=False, and not for a window (which
                # sample.py --compile refuses)
                if check == "decode step" and (fused or config == "sliding window"):
                    continue
                try:
                    run(invariants.build(module, fused, options))
                    failed[path, check, config] = False
                except AssertionError:
                    failed[path, check, config] = True
    return failed


def broken(test, breaks):
    """Whether test, a (path, check, config), is among breaks."""

    def matches(wanted, name):
        return wanted is None or name == wanted or (isinstance(wanted, tuple) and name in wanted)

    return any(all(map(matches, pattern, test)) for pattern in breaks)


@pytest.mark.parametrize("name", list(EDITS))
def test_the_invariants_pass_a_legitimate_edit_and_fail_a_bug(name, tmp_path):
    failed = failures(edited_model(tmp_path, *EDITS[name]))
    wrong = [test for test in failed if failed[test] != broken(test, BREAKS[name])]
    assert not wrong, [
        ("fails: " if failed[test] else "passes: ") + " ".join(test) for test in wrong
    ]
