"""The explorer following a training run live, in a real browser (Debian's headless
Chromium, driven by Selenium): a real train.py process writes the run's folder
(--snapshots=True --log_heads=True) while the page is open, and the step slider and
the timeline gain each new snapshot and evaluation without a reload; then the page
plays through the steps.

The process is held with SIGSTOP at chosen moments, so that the page can be compared
with the folder as it stands then (the snapshots listed, the log's complete lines),
whatever the machine's speed. Skipped only where chromium or chromedriver is not
installed, as the page's other tests.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

# pytest puts tests/ on the path: train.py's settings, the server and the browser helpers
from conftest import ROOT, child_env, read_log, tiny_run
from test_explore import serve
from test_explore_browser import browser, pytestmark, wait_for  # noqa: F401 (the skip mark)

from explorer.live import open_model
from explorer.server import Explorer
from support import timeline
from support.run_log import read_evaluations

EVERY = 10  # iters between evaluations
ITERS = 40  # evaluations at 0, 10, 20, 30 and 40


def page(driver):
    """What the page holds and shows, read in one script."""
    return driver.execute_script(
        "return {steps: state.steps, max: Number(document.getElementById('step').max),"
        " label: document.getElementById('step-label').textContent,"
        " evaluations: state.timeline ? state.timeline.evaluations.map((e) => e.iter) : null,"
        " val: state.timeline ? state.timeline.evaluations.map((e) => e.val_loss) : null,"
        " icl: state.timeline ? state.timeline.evaluations.map((e) => e.icl_score) : null,"
        " summary: document.getElementById('timeline-summary').textContent,"
        " opened: window.openedOnce === true,"
        " status: document.getElementById('status').textContent};"
    )


def on_disk(run):
    """The run as it stands: its snapshots, and the iters of its log's complete lines."""
    records = []
    if os.path.exists(os.path.join(run, "log.jsonl")):
        records = read_evaluations(run)
    return list(timeline.list_snapshots(run)), [r["iter"] for r in records]


def shows(driver, run):
    """Whether the page shows the run as it stands, as one page load (no reload)."""
    seen = page(driver)
    steps, iters = on_disk(run)
    return seen["opened"] and seen["steps"] == steps and seen["evaluations"] == iters and seen


def log_lines(run):
    return len(on_disk(run)[1])


def wait_until_logged(child, run, n):
    """Hold the run with SIGSTOP once its log has n complete lines."""
    deadline = time.monotonic() + 120
    while log_lines(run) < n:
        assert child.poll() is None, "train.py ended before its evaluations"
        assert time.monotonic() < deadline, f"train.py logged no {n} evaluations in 120 s"
        time.sleep(0.01)
    child.send_signal(signal.SIGSTOP)


@pytest.mark.exclusive
def test_the_page_follows_a_run_being_trained(data_root, tmp_path):
    run = str(tmp_path / "run")
    argv = tiny_run(
        data_root,
        run,
        f"--max_iters={ITERS}",
        f"--eval_interval={EVERY}",
        "--snapshots=True",
        "--log_heads=True",
        "--snapshot_limit=100",
    )
    with open(tmp_path / "train.log", "w") as out:
        child = subprocess.Popen(
            [sys.executable, "train.py", *argv], cwd=ROOT, env=child_env(), stdout=out, stderr=out
        )
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver = browser(tmp_path / "profile", downloads)
    server = None
    try:
        # the first evaluation: no ckpt.pt yet, the explorer opens the snapshot at iter 0
        wait_until_logged(child, run, 1)
        model, tok, folder, step, opened = open_model("", run)
        assert (step, opened) == (0, "snapshot")
        server, guard = serve(Explorer(model.eval(), tok, folder, step=step, opened=opened))
        driver.get(f"http://127.0.0.1:{server.server_port}/?view=timeline")
        wait_for(lambda: driver.find_elements("css selector", "#grid button"), "draw the heads")
        driver.execute_script("window.openedOnce = true;")  # gone, were the page reloaded
        first = wait_for(lambda: shows(driver, run), "show the first evaluation")
        assert first["steps"] == [0] and first["evaluations"] == [0]
        assert "1 evaluation(s)" in first["summary"]
        assert driver.find_element("id", "steps").is_displayed() is False  # one step: no slider
        # the run goes on, and is held again at its third evaluation
        child.send_signal(signal.SIGCONT)
        wait_until_logged(child, run, 3)
        middle = wait_for(lambda: shows(driver, run), "show the new evaluations")
        assert middle["evaluations"][:3] == [0, 10, 20] and len(middle["steps"]) >= 3
        assert middle["max"] == len(middle["steps"]) - 1
        # the slider sat on the last step: it follows the newest
        newest = middle["steps"][-1]
        wait_for(lambda: page(driver)["label"] == f"iter {newest} (snapshot)", "follow")
        # to the end of the run
        child.send_signal(signal.SIGCONT)
        assert child.wait(timeout=120) == 0, (tmp_path / "train.log").read_text()[-2000:]
        last = wait_for(lambda: shows(driver, run), "show the whole run")
        assert last["steps"] == [0, 10, 20, 30, 40]
        assert last["evaluations"] == [r["iter"] for r in read_log(run)]
        assert last["val"] == [r["val_loss"] for r in read_log(run)]
        assert last["icl"] == [r["icl_score"] for r in read_log(run)]
        for chart in ("timeline-loss", "timeline-icl", "timeline-induction"):
            assert driver.find_element("id", chart).is_displayed()
        assert f"{len(last['evaluations'])} evaluation(s), iters 0 to {ITERS}" in last["summary"]
        wait_for(lambda: page(driver)["label"] == f"iter {ITERS} (snapshot)", "follow to the end")
        assert driver.find_element("id", "steps").is_displayed()
        # play: every step in turn, from the first, each drawn before the next
        labels = [page(driver)["label"]]
        driver.find_element("id", "play").click()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen = page(driver)
            if labels[-1] != seen["label"]:
                labels.append(seen["label"])
            if driver.find_element("id", "play").text == "Play" and len(labels) > 1:
                break
            time.sleep(0.02)
        assert labels == [f"iter {s} (snapshot)" for s in [ITERS, 0, 10, 20, 30, 40]]
        assert page(driver)["status"] == "" and page(driver)["opened"]
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
        driver.quit()
        if server is not None:
            guard.cancel()
            server.shutdown()
            server.server_close()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)
