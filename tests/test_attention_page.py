"""The attention page: support/attention_page/ inlined into one offline index.html.

The page is written by a separate Python process started in another folder, so
the page files are found from the module, not from the working directory; the
maps are read back from the page as its JavaScript reads them, and a real
browser (headless Chromium, where it is installed) runs the script.
"""

import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from support import attention_maps as am

TEXT = "ROMEO:\nWhat light </script> breaks? <b>&amp;</b>"
N_LAYER, N_HEAD = 2, 3


def random_maps(T, seed=0):
    """Causal maps whose rows sum to 1, peaked enough to give the heads labels."""
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(N_LAYER):
        a = rng.random((N_HEAD, T, T)) ** 6 * np.tril(np.ones((T, T)))
        layers.append((a / a.sum(-1, keepdims=True)).astype(np.float32))
    return layers


WRITE_PAGE = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from support import attention_maps as am
z = np.load(sys.argv[2])
layers = [z["layer_0"], z["layer_1"]]
tokens = [str(t) for t in z["tokens"]]
am.save_html("index.html", layers, tokens, 5, am.all_head_stats(layers, tokens))
"""


@pytest.fixture(scope="module")
def written(tmp_path_factory, repo_root):
    """index.html written from a folder that is not the repository."""
    folder = tmp_path_factory.mktemp("elsewhere")
    tokens = list(TEXT)
    layers = random_maps(len(tokens))
    am.save_npz(folder / "maps.npz", layers, tokens)
    subprocess.run(
        [sys.executable, "-c", WRITE_PAGE, repo_root, "maps.npz"], cwd=folder, check=True
    )
    html = (folder / "index.html").read_text(encoding="utf-8")
    return {"path": folder / "index.html", "html": html, "layers": layers, "tokens": tokens}


def page_data(html):
    found = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(found.group(1))


def page_file(name):
    with open(os.path.join(am.PAGE_DIR, name), encoding="utf-8") as f:
        return f.read()


def test_page_is_one_self_contained_file(written):
    page = written["html"]
    # nothing fetched from anywhere: no URL, no linked file, no image
    assert not re.search(r"https?://|//cdn|@import|<link|\bsrc=|\bhref=|<img|url\(", page, re.I)
    # the style and script are the files beside the module, inline
    assert "<style>\n" + page_file("page.css") + "</style>" in page
    assert "<script>\n" + page_file("page.js") + "</script>" in page
    assert "__DATA__" not in page
    # the tokens' own "</script>" and "<b>" stay inside the data: the two scripts close, no more
    assert page.count("</script>") == 2 and "<b>" not in page


def test_page_carries_the_maps(written):
    data = page_data(written["html"])
    tokens, layers = written["tokens"], written["layers"]
    T = len(tokens)
    assert data["tokens"] == [am.display_token(t) for t in tokens]
    assert data["first_position"] == 5 and data["total_tokens"] == T
    assert len(data["maps"]) == N_LAYER and all(len(h) == N_HEAD for h in data["maps"])
    # decoded as page.js does: bytes round(255 sqrt(w)), the lower triangle row by row
    for layer in range(N_LAYER):
        for head in range(N_HEAD):
            b = np.frombuffer(base64.b64decode(data["maps"][layer][head]), dtype=np.uint8)
            expected = layers[layer][head][np.tril_indices(T)]
            np.testing.assert_allclose((b / 255.0) ** 2, expected, atol=0.005)
    assert data["stats"] == am.all_head_stats(layers, tokens)


def test_a_page_file_that_would_break_the_page_is_refused():
    with pytest.raises(ValueError, match="exactly once"):
        am._inline("<html></html>", '<script src="page.js"></script>', "script", "")
    with pytest.raises(ValueError, match="</script"):
        am._inline(
            '<script src="page.js"></script>',
            '<script src="page.js"></script>',
            "script",
            'let s = "</SCRIPT>";',
        )


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium to open the page in")


def browser_dom(path, profile):
    """The page's document after its scripts ran in headless Chromium."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    flags += [f"--user-data-dir={profile}", "--dump-dom", path.as_uri()]
    done = subprocess.run([CHROMIUM, *flags], capture_output=True, text=True, timeout=120)
    return done.stdout


def query_title(position, token):
    """The heading over the list of keys, as the browser writes it out."""
    return html.escape(f'token {position} "{am.display_token(token)}" attends to:', quote=False)


# Not marked exclusive: the browser loads one file, runs its scripts and writes out
# the page, in under a second, with nothing timed and no server beside it.
@needs_chromium
def test_a_browser_runs_the_page(written, tmp_path):
    """The script ran: the head buttons carry the labels, the last token is the query."""
    dom = browser_dom(written["path"], tmp_path / "profile")
    labels = [s["label"] for s in am.all_head_stats(written["layers"], written["tokens"])]
    buttons = re.findall(r"<button[^>]*>(.*?)</button>", dom)
    assert buttons == [f"{h}: {labels[h]}" for h in range(N_HEAD)]
    T = len(written["tokens"])
    assert query_title(5 + T - 1, written["tokens"][-1]) in dom
    assert dom.count('<option value="') == N_LAYER


# picks layer 1 and head 2 as a reader would, then points at token 20
PICK_AND_HOVER = """<script>
$("layer").value = "1";
$("layer").dispatchEvent(new Event("change"));
$("heads").querySelectorAll("button")[2].click();
document.querySelectorAll("#tokens span")[20].dispatchEvent(new MouseEvent("mouseenter"));
</script>
</body>"""


@needs_chromium
def test_picking_a_head_and_hovering_a_token_shows_its_weights(written, tmp_path):
    page = tmp_path / "index.html"
    page.write_text(written["html"].replace("</body>", PICK_AND_HOVER), encoding="utf-8")
    dom = browser_dom(page, tmp_path / "profile")
    assert query_title(5 + 20, written["tokens"][20]) in dom
    assert re.search(r'<button[^>]*class="on"[^>]*>2: ', dom)
    # the heaviest key comes first, with the weight the page holds: the byte squared back,
    # kept in a Float32Array
    row = written["layers"][1][2][20, :21]
    stored = ((np.rint(255 * np.sqrt(row)) / 255.0) ** 2).astype(np.float32)
    first = re.search(r'<div id="top"><div>([0-9.]+)<span', dom).group(1)
    assert first == f"{float(stored.max()):.3f}"
