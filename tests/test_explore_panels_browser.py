"""The explorer's "why this token", logit lens and patching panels and its step slider in
a real browser (Debian's headless Chromium, driven by Selenium), opened from a shared
address and reopened by a reload, and exported.

What the page shows is checked against the server's own answers for the same state.
Skipped only where chromium or chromedriver is not installed, as the page's other test.
"""

import shutil
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

# pytest puts tests/ on the path: the model, the run's folder, the browser of the other tests
from test_explore import PROMPT, serve, trained  # noqa: F401 (a fixture)
from test_explore_browser import browser, pytestmark, wait_for  # noqa: F401 (the skip mark)
from test_explore_why import CLEAN, CORRUPT, run_dir  # noqa: F401 (a fixture)

from explorer.server import Explorer


def texts(driver, selector):
    """The text of every element selector finds, read in one script."""
    script = "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent);"
    return driver.execute_script(script, selector)


def by_id(driver, ids):
    script = "return arguments[0].map((id) => (document.getElementById(id) || {}).textContent);"
    return driver.execute_script(script, ids)


def class_of(driver, element_id):
    """The element's class, read in one script: "" while the page has not drawn it."""
    script = "return (document.getElementById(arguments[0]) || {className: ''}).className;"
    return driver.execute_script(script, element_id)


def attribution_shown(driver, n_layer, n_head):
    """The attribution grid as the page shows it: heads, MLPs, embeddings, bias."""
    heads = by_id(driver, [f"attr-{i}-{h}" for i in range(n_layer) for h in range(n_head)])
    rest = by_id(driver, [f"attr-mlp-{i}" for i in range(n_layer)] + ["attr-embed", "attr-bias"])
    return heads + rest


def attribution_answer(a):
    return [v for row in a["heads"] for v in row] + a["mlp"] + [a["embed"], a["bias"]]


def same(texts, values):
    """Whether the page's numbers (2 decimals) are the values: JavaScript and Python
    write -0.001 and -0.0 differently, so the numbers are compared, not the text."""
    if len(texts) != len(values) or None in texts:
        return False
    return all(abs(float(t) - v) <= 0.005 + 1e-9 for t, v in zip(texts, values))


def shows(driver, a):
    """Whether the page's attribution grid shows the attribution a."""
    n_layer, n_head = len(a["heads"]), len(a["heads"][0])
    return same(attribution_shown(driver, n_layer, n_head), attribution_answer(a))


def lens_shown(driver):
    """The logit lens table's rows of top tokens (its first row and column are headings)."""
    script = (
        "return [...document.querySelectorAll('#lens tr')].slice(1)"
        ".map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent));"
    )
    return driver.execute_script(script)


def shown(token):
    return token.replace(" ", "\u2423").replace("\n", "\u21b5")


@pytest.mark.exclusive
def test_why_lens_patching_and_steps_from_a_shared_address(trained, run_dir, tmp_path):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    model, tok = trained["model"], trained["tok"]
    n_layer, n_head = model.config.n_layer, model.config.n_head
    explorer = Explorer(model, tok, run_dir["dir"], step=80)
    server, guard = serve(explorer)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver = browser(tmp_path / "profile", downloads)
    try:
        # a shared link: the why view, a prompt, a head picked and one switched off
        query = urlencode({"prompt": PROMPT, "layer": 1, "head": 2, "off": "0.1", "view": "why"})
        driver.get(f"http://127.0.0.1:{server.server_port}/?{query}")
        answer = explorer.analyze({"prompt": PROMPT, "ablate": [[0, 1]]})
        wait_for(
            lambda: shows(driver, answer["attribution"]), "show the attribution of the next token"
        )
        assert driver.find_element(By.ID, "why-view").is_displayed()
        assert not driver.find_element(By.ID, "view").is_displayed()
        wait_for(lambda: "off" in class_of(driver, "ablate-0-1"), "draw the ablated head")
        assert "selected" in driver.find_element(By.ID, "attr-1-2").get_attribute("class")
        want_lens = [
            [shown(cells[0]["token"]) for cells in point] for point in answer["logit_lens"]
        ]
        assert lens_shown(driver) == want_lens
        # the token under the mouse: why it came, from the position before it
        k = 9
        token = driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")[k]
        ActionChains(driver).move_to_element(token).perform()
        wait_for(
            lambda: shows(driver, answer["token_attribution"][k - 1]),
            "show the attribution of the token under the mouse",
        )
        assert f"(token {k})" in driver.find_element(By.ID, "why-title").text
        # the step slider: back to the snapshot at iter 40, and everything is redrawn there
        slider = driver.find_element(By.ID, "step")
        assert driver.find_element(By.ID, "step-label").text == "iter 80 (ckpt.pt)"
        slider.send_keys(Keys.HOME)
        earlier = explorer.analyze({"prompt": PROMPT, "ablate": [[0, 1]], "step": 40})
        wait_for(lambda: shows(driver, earlier["token_attribution"][k - 1]), "redraw at step 40")
        assert driver.find_element(By.ID, "step-label").text == "iter 40 (snapshot)"
        assert parse_qs(urlparse(driver.current_url).query)["step"] == ["40"]
        # patching, at that step, with the head still off
        driver.find_element(By.ID, "view-patch").click()
        for name, value in (("clean", CLEAN), ("corrupt", CORRUPT), ("target", "o"), ("foil", "u")):
            box = driver.find_element(By.ID, name)
            box.clear()
            box.send_keys(value)
        driver.find_element(By.ID, "patch").click()
        body = {"clean": CLEAN, "corrupt": CORRUPT, "target": "o", "foil": "u"}
        patched = explorer.patch({**body, "ablate": [[0, 1]], "step": 40})
        want_patch = [v for row in patched["heads"] for v in row]
        patch_ids = [f"patch-{i}-{h}" for i in range(n_layer) for h in range(n_head)]
        wait_for(lambda: same(by_id(driver, patch_ids), want_patch), "show the patching grid")
        # a bad request: its one line, on the page
        driver.find_element(By.ID, "corrupt").send_keys(Keys.BACK_SPACE)
        driver.find_element(By.ID, "patch").click()
        wait_for(
            lambda: "same token length" in driver.find_element(By.ID, "status").text,
            "say what is wrong",
        )
        driver.find_element(By.ID, "corrupt").send_keys(CORRUPT[-1])
        driver.find_element(By.ID, "patch").click()
        wait_for(lambda: same(by_id(driver, patch_ids), want_patch), "patch again")
        # the address holds the whole state: a reload reopens the same view
        url = driver.current_url
        state = parse_qs(urlparse(url).query)
        assert state["view"] == ["patch"] and state["off"] == ["0.1"] and state["step"] == ["40"]
        assert state["clean"] == [CLEAN] and state["prompt"] == [PROMPT]
        driver.get("about:blank")
        driver.get(url)
        wait_for(lambda: same(by_id(driver, patch_ids), want_patch), "reopen the patching view")
        assert driver.find_element(By.ID, "patch-view").is_displayed()
        assert driver.find_element(By.ID, "step-label").text == "iter 40 (snapshot)"
        assert driver.find_element(By.ID, "clean").get_attribute("value") == CLEAN
        # the ablation grid is drawn once its own answer comes, after the patching view's
        wait_for(lambda: "off" in class_of(driver, "ablate-0-1"), "redraw the ablated head")
        assert driver.find_element(By.ID, "head").get_attribute("value") == "2"
        wait_for(lambda: lens_shown(driver) and lens_shown(driver)[0], "draw the lens")
        # the export carries the new panels, and they work from the file alone
        # the mouse on token k again (after the reload it may rest on any token), then export
        token = driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")[k]
        ActionChains(driver).move_to_element(token).perform()
        driver.find_element(By.ID, "export-html").click()
        driver.find_element(By.ID, "export-png").click()
        for name in ("attention.html", "attention.png"):
            wait_for(lambda: (downloads / name).exists(), f"export {name}")
        with open(downloads / "attention.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        guard.cancel()
        server.shutdown()
        server.server_close()
        driver.get((downloads / "attention.html").as_uri())
        wait_for(lambda: same(by_id(driver, patch_ids), want_patch), "reopen the export")
        assert driver.find_element(By.ID, "patch-view").is_displayed()
        driver.find_element(By.ID, "view-why").click()
        assert shows(driver, earlier["token_attribution"][k - 1])
        assert len(lens_shown(driver)) == n_layer + 1
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)
