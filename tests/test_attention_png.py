"""The attention PNGs name their rows and columns: what a newcomer reads off layer_N.png.

A PNG keeps no text, so each figure is caught as save_pngs closes it, and its axes are
read back: the tick labels matplotlib drew, in order, against the tokens passed in.
"""

import matplotlib
import numpy as np
import pytest

from support import attention_maps

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    caught = []
    close = plt.close

    def keep(fig=None):
        caught.append(fig)
        close(fig)

    monkeypatch.setattr(plt, "close", keep)
    return caught


def causal_maps(n_layer, n_head, T, seed=0):
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((n_layer, n_head, T, T)) + 0.01)
    return list(w / w.sum(-1, keepdims=True))


def tick_texts(axis):
    return [t.get_text() for t in axis.get_ticklabels()]


def test_every_token_is_named_on_both_axes_in_order(tmp_path, figures):
    text = "ROMEO:\nWhy, he cannot come"
    tokens = list(text)
    stats = [{"layer": 0, "head": h, "label": f"kind {h}"} for h in range(4)]
    paths = attention_maps.save_pngs(tmp_path, causal_maps(2, 4, len(tokens)), tokens, stats=stats)
    assert [p.endswith(f"layer_{i}.png") for i, p in enumerate(paths)] == [True, True]
    assert len(figures) == 2
    expected = ["R", "O", "M", "E", "O", ":", "\u21b5", "W", "h", "y", ",", "\u2423", "h", "e"]
    for fig in figures:
        heads = [ax for ax in fig.axes if ax.get_title()]
        assert len(heads) == 4
        for ax in heads:
            assert tick_texts(ax.xaxis) == [attention_maps.display_token(t) for t in tokens]
            assert tick_texts(ax.yaxis)[: len(expected)] == expected
            # characters stand upright, so that a word reads along the bottom
            assert {t.get_rotation() for t in ax.xaxis.get_ticklabels()} == {0.0}
    titles = [ax.get_title() for ax in figures[0].axes if ax.get_title()]
    assert titles == [f"layer 0, head {h}: kind {h}" for h in range(4)]
    assert "every" not in figures[0].get_suptitle()


def test_past_the_limit_every_kth_token_is_named_and_the_title_says_which(tmp_path, figures):
    T = 3 * attention_maps.LABEL_MAX_TOKENS + 5
    tokens = [chr(ord("a") + i % 26) for i in range(T)]
    attention_maps.save_pngs(tmp_path, causal_maps(1, 2, T), tokens, window_start=100)
    (fig,) = figures
    every = 4  # ceil(197 / 64)
    assert f"(every {every}th named)" in fig.get_suptitle()
    assert "tokens 100..296" in fig.get_suptitle()
    ax = [a for a in fig.axes if a.get_title()][0]
    assert tick_texts(ax.xaxis) == tokens[::every]
    # the ticks sit at the named tokens' absolute positions
    assert list(ax.get_xticks()) == list(range(100, 100 + T, every))
