"""The explorer's page in a real browser: Debian's headless Chromium, driven by Selenium.

Load the page, type a prompt, pick a head, switch a head off and see the
probabilities change, generate, export the .html and the .png, and write a
screenshot. Skipped only where chromium or chromedriver is not installed
(.ci/run installs them).
"""

import os
import shutil
import time

import pytest

# pytest puts tests/ on the path: the same model fixture and server as the API's tests
from test_explore import PROMPT, serve, trained  # noqa: F401 (trained is a fixture)

from explorer.server import Explorer

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 60  # seconds for anything the page does

# not the page's example prompt (PROMPT itself, cut to the context): the tokens
# shown equal the typed ones only once the last analysis has come back
TYPED = PROMPT.lower()
LONG_TOKEN = " the whole<|endoftext|>"

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
)


def browser(profile, downloads):
    """Headless Chromium that fetches nothing on its own, downloads into downloads."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,1100",
    ):
        options.add_argument(arg)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    # the driver given by path: Selenium Manager never looks for one to download
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    return driver


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"the page did not {what} within {WAIT} s")


def page_status(driver):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, "status").text


def columns(driver):
    """Each comparison column's next-token probabilities, as the page shows them (read
    in one script: the page may redraw between two of Selenium's calls)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#compare .column')]"
        ".map((c) => [...c.querySelectorAll('.p')].map((p) => p.textContent));"
    )


def drive(driver, url, prompt, head, downloads, screenshot):
    """The walk through the page; returns what it saw along the way."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def tokens():
        return driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")

    seen = {}
    driver.get(url)
    drawn = wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, "#grid button") or page_status(driver),
        "draw the heads",
    )
    assert not isinstance(drawn, str), f"the page says: {drawn}"
    box = driver.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(prompt)
    # the page's tokens, read in one script, once they are the typed prompt's
    typed = [t.replace(" ", "\u2423").replace("\n", "\u21b5") for t in prompt]
    script = "return [...document.querySelectorAll('#tokens .tok')].map((t) => t.textContent);"
    seen["tokens"] = wait_for(
        lambda: (shown := driver.execute_script(script)) == typed and shown,
        "show the prompt's tokens",
    )
    Select(driver.find_element(By.ID, "layer")).select_by_value(str(head[0]))
    Select(driver.find_element(By.ID, "head")).select_by_value(str(head[1]))
    seen["label"] = driver.find_element(By.ID, "head-label").text
    ActionChains(driver).move_to_element(tokens()[-3]).perform()
    seen["hovered"] = "hover" in tokens()[-3].get_attribute("class")
    seen["intact"] = wait_for(lambda: columns(driver), "show the probabilities")[0]
    # a next token wider than its column (GPT-2's BPE has them): cut with an ellipsis,
    # and whole in its title (before, cut with no mark, and nowhere whole)
    seen["long token"] = driver.execute_script(
        "const c = column('t', {loss: null, next: [{token: LONG, prob: 1}], token_loss: [1],"
        " continuation: []}, 'x');"
        "document.body.appendChild(c);"
        "const name = c.querySelector('.bar .name');"
        "const seen = [name.scrollWidth > name.clientWidth, name.title,"
        " getComputedStyle(name).textOverflow];"
        "c.remove();"
        "return seen;".replace("LONG", repr(LONG_TOKEN))
    )
    driver.find_element(By.ID, f"ablate-{head[0]}-{head[1]}").click()
    seen["compare"] = wait_for(lambda: (c := columns(driver)) and len(c) == 2 and c, "compare")
    seen["off"] = driver.find_element(By.ID, f"ablate-{head[0]}-{head[1]}").get_attribute("class")
    driver.find_element(By.ID, "length").clear()
    driver.find_element(By.ID, "length").send_keys("12")
    driver.find_element(By.ID, "generate").click()
    wait_for(
        lambda: (
            driver.find_elements(By.CSS_SELECTOR, "#tokens .tok.new")
            and driver.find_element(By.ID, "generate").is_enabled()
        ),
        "generate",
    )
    seen["new"] = len(driver.find_elements(By.CSS_SELECTOR, "#tokens .tok.new"))
    ActionChains(driver).move_to_element(tokens()[-1]).perform()
    seen["label_at_export"] = driver.find_element(By.ID, "head-label").text
    driver.save_screenshot(str(screenshot))
    driver.find_element(By.ID, "export-html").click()
    driver.find_element(By.ID, "export-png").click()
    for name in ("attention.html", "attention.png"):
        wait_for(lambda: os.path.exists(os.path.join(downloads, name)), f"export {name}")
    seen["status"] = driver.find_element(By.ID, "status").text
    return seen


@pytest.mark.exclusive
def test_the_page_in_a_browser(trained, tmp_path):  # noqa: F811
    server, guard = serve(Explorer(trained["model"], trained["tok"]))
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver = browser(tmp_path / "profile", downloads)
    try:
        url = f"http://127.0.0.1:{server.server_port}/"
        head = (1, 2)
        seen = drive(driver, url, TYPED, head, downloads, tmp_path / "explore.png")
        assert seen["status"] == ""
        assert seen["tokens"] == [t.replace(" ", "\u2423").replace("\n", "\u21b5") for t in TYPED]
        assert seen["label"].startswith("L1 H2: ")
        assert seen["hovered"]
        assert seen["long token"] == [True, "\u2423the\u2423whole<|endoftext|>", "ellipsis"]
        assert "off" in seen["off"]
        # the page shows what the API answers: intact beside ablated, and they differ
        answer = server.explorer.analyze({"prompt": TYPED, "ablate": [list(head)]})
        shown = [[f"{n['prob']:.4f}" for n in a["next"]] for a in (answer, answer["intact"])]
        assert seen["compare"] == shown
        assert seen["intact"] == shown[1]
        assert shown[0] != shown[1]
        assert seen["new"] > 0
        with open(tmp_path / "explore.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        with open(downloads / "attention.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        guard.cancel()
        server.shutdown()
        server.server_close()
        from selenium.webdriver.common.by import By

        # the server gone (Ctrl-C): the page says so, where the browser said "Failed to fetch"
        for ask in ("analyze", "generate"):
            driver.execute_script("document.getElementById('status').textContent = '';")
            if ask == "analyze":
                driver.find_element(By.ID, "prompt").send_keys("x")
            else:
                driver.find_element(By.ID, "generate").click()
            said = wait_for(lambda: page_status(driver), f"say why it cannot {ask}")
            assert said.startswith("no answer from explore.py: is it still running?"), said
        # the exported page works alone: from a file, with the server gone
        html = (downloads / "attention.html").read_text(encoding="utf-8")
        assert "EXPLORER_SNAPSHOT" in html and "://" not in html
        driver.get((downloads / "attention.html").as_uri())

        grid = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#grid button"), "reopen")
        assert len(grid) == 2 * 4
        assert driver.find_element(By.ID, "head-label").text == seen["label_at_export"]
        assert len(columns(driver)) == 2
        # ... and exports itself again, whole
        (downloads / "attention.html").rename(downloads / "first.html")
        driver.find_element(By.ID, "export-html").click()
        wait_for(lambda: os.path.exists(downloads / "attention.html"), "export again")
        again = (downloads / "attention.html").read_text(encoding="utf-8")
        assert ".grid button.off" in again and "function exportHtml" in again
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)
