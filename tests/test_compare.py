"""compare.py, the command that says whether a hack helped: its statistics against scipy, and
the command itself as a new user runs it, in a real git repository made from this working tree
with an edit to model.py: the pairing (the same batches for both runs of a pair), the user's
tree left byte for byte as it was, the runs kept and not trained again, Ctrl-C, and each bad
input as one line with its exit code."""

import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch
from conftest import ROOT, child_env, error_line
from scipy import special, stats

from data.dataset import load_meta, load_split, step_batches
from support import arms, compare_runs, compare_stats

# -----------------------------------------------------------------------------
# The statistics, against scipy


@pytest.mark.parametrize("df", [1, 2, 3, 5, 9, 30, 200])
def test_the_t_distribution_is_scipys(df):
    for t in [0.0, 0.05, 0.7, 1.0, 2.0, 3.18, 6.5, 40.0, -2.5]:
        assert compare_stats.t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), rel=1e-10)
        two_sided = 2 * stats.t.sf(abs(t), df)
        assert compare_stats.t_two_sided(t, df) == pytest.approx(two_sided, rel=1e-9, abs=1e-300)
    for q in [0.5, 0.6, 0.9, 0.975, 0.995, 0.9999, 0.025]:
        assert compare_stats.t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), rel=1e-9)


def test_the_incomplete_beta_is_scipys():
    for a, b, x in [
        (0.5, 0.5, 0.3),
        (10, 0.5, 0.99),
        (200, 0.5, 0.999),
        (0.5, 200, 1e-3),
        (3, 4, 0.5),
    ]:
        assert compare_stats.betainc(a, b, x) == pytest.approx(special.betainc(a, b, x), rel=1e-10)


SAMPLES = [
    # (A's losses, B's losses): a clear gain, noise alone, a loss, two pairs, many pairs
    ([1.872, 1.869, 1.881, 1.875], [1.851, 1.850, 1.858, 1.852]),
    ([1.872, 1.869, 1.881, 1.875], [1.874, 1.866, 1.880, 1.879]),
    ([2.40, 2.41, 2.38], [2.47, 2.46, 2.47]),
    ([1.5, 1.6], [1.55, 1.62]),
]


@pytest.mark.parametrize(
    "a, b", SAMPLES + [tuple(np.random.default_rng(3).normal(2, 0.01, (2, 12)))]
)
def test_the_paired_interval_and_p_value_are_scipys(a, b):
    result = compare_stats.paired(list(a), list(b))
    oracle = stats.ttest_rel(b, a)
    interval = oracle.confidence_interval(0.95)
    assert result.t == pytest.approx(oracle.statistic, rel=1e-9)
    assert result.p == pytest.approx(oracle.pvalue, rel=1e-9)
    assert result.low == pytest.approx(interval.low, rel=1e-9)
    assert result.high == pytest.approx(interval.high, rel=1e-9)
    assert result.sd == pytest.approx(np.std(np.subtract(b, a), ddof=1), rel=1e-12)


def test_the_verdict_says_what_the_interval_says():
    better = compare_stats.paired(*SAMPLES[0])
    interval = stats.ttest_rel(SAMPLES[0][1], SAMPLES[0][0]).confidence_interval(0.95)
    # B's losses are lower: B is better, by A - B, its interval the other way round
    assert compare_stats.verdict(better) == (
        f"B is better by {-better.mean:.4f} nats (95% CI {-interval.high:.4f} to "
        f"{-interval.low:.4f}, p = {compare_stats.p_text(better.p)}, 4 pairs)"
    )
    assert compare_stats.verdict(compare_stats.paired(*SAMPLES[2])).startswith("B is worse by 0.07")
    noise = compare_stats.paired(*SAMPLES[1])
    words = compare_stats.verdict(noise)
    assert words.startswith(f"no difference detected: 4 pairs resolve +/-{noise.half_width:.4f}")
    # the pairs it names would resolve half the width, and one fewer would not
    n = compare_stats.pairs_to_resolve(noise.sd, noise.half_width / 2)
    assert f"about {n} would resolve +/-{noise.half_width / 2:.4f}" in words
    width = [stats.t.ppf(0.975, m - 1) * noise.sd / math.sqrt(m) for m in (n - 1, n)]
    assert width[1] <= noise.half_width / 2 < width[0]
    same = compare_stats.paired([1.0, 2.0], [1.0, 2.0])
    assert compare_stats.verdict(same).startswith("no difference: the arms gave the same loss")


def test_the_unpaired_spread_is_that_of_differences_across_pairs():
    a, b = SAMPLES[0]
    across = [y - x for i, x in enumerate(a) for j, y in enumerate(b) if i != j]
    assert compare_stats.unpaired_sd(a, b) == pytest.approx(np.std(across, ddof=1))


# -----------------------------------------------------------------------------
# Another train.py on the machine, told from a run's own processes


def sleeper(marker):
    """A Python process whose command line names train.py, with marker to find it by."""
    return [sys.executable, "-c", "import time; time.sleep(60)", "train.py", marker]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads Linux's /proc")
def test_a_process_the_run_forks_is_the_run_and_an_unrelated_train_py_is_another():
    """A run's child carries the run's command line until it execs (inductor's compile
    workers, any subprocess): it is the run. A train.py started apart from the run, whose
    parent has exited, is another trainer."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    # the run: a process named train.py that forks a child, which keeps its command line
    forking = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)"
    run = subprocess.Popen([sys.executable, "-c", forking, "train.py", "run-" + tag])
    # an unrelated one: started by a shell that exits at once, so no parent of ours
    shell = subprocess.run(
        ["sh", "-c", shlex.join(sleeper("apart-" + tag)) + " >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    apart = int(shell.stdout.split()[-1])
    try:
        # until the fork has happened and the shell's child has become the sleeper
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (children(run.pid) and named(apart)):
            time.sleep(0.05)
        forked = children(run.pid)
        assert forked and named(apart), "the processes did not start"
        assert compare_runs.descends(forked[0], {run.pid})
        assert not compare_runs.descends(apart, {os.getpid()})
        found = compare_runs.other_trainers({run.pid})
        assert [line for line in found if "apart-" + tag in line], found
        assert not [line for line in found if "run-" + tag in line], found
        watch = compare_runs.Watch(run.pid)
        watch.look()
        marked = [line for line in watch.result()["other_trainers"] if tag in line]
        assert marked == [" ".join(sleeper("apart-" + tag))]
    finally:
        for pid in [apart, *children(run.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        run.kill()
        run.wait()


def named(pid):
    """Whether process pid's command line names train.py."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"train.py" in f.read().split(b"\0")
    except OSError:
        return False


def children(pid):
    """The pids whose parent is pid."""
    return [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit() and compare_runs.parent(int(name)) == pid
    ]


# -----------------------------------------------------------------------------
# What only the written-out attention runs


@pytest.mark.parametrize(
    "old, new, edited",
    [
        # the lecture's hack, in attention()'s body
        (
            "/ math.sqrt(d)  # (..., Tq, Tk)",
            "/ d  # (..., Tq, Tk)",
            ["attention"],
        ),
        # the masking rule: causal_mask() calls it, the fused kernel never does
        ("    causal = j <= i\n", "    causal = j <= i + 1\n", ["visible"]),
        # a docstring or a comment changes no run
        ("Attention written out, so", "Attention, written out so", []),
        ("# dividing by sqrt(d) keeps", "# dividing by the root of d keeps", []),
        # the MLP runs on both paths: the fused kernel trains it as written
        ("x = x * x", "x = x * x * 0.5", []),
    ],
)
def test_an_edit_is_found_in_the_functions_the_fused_kernel_never_runs(tmp_path, old, new, edited):
    for arm in ("a", "b"):
        os.makedirs(tmp_path / arm)
        shutil.copy(os.path.join(ROOT, "model.py"), tmp_path / arm / "model.py")
    edit(str(tmp_path / "b" / "model.py"), old, new)
    assert arms.written_out_edits(str(tmp_path / "a"), str(tmp_path / "b")) == edited


# -----------------------------------------------------------------------------
# The command, in a repository of its own


# the lecture's hack: scores divided by d rather than sqrt(d), inside attention()
STOCK = "    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., Tq, Tk)\n"
HACK = "    scores = q @ k.transpose(-2, -1) / d  # (..., Tq, Tk)\n"
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
TINY = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=32",
    "--batch_size=8",
    "--max_iters=8",
    "--eval_iters=1",
    "--dtype=float32",
    "--threads=1",
]


def edit(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def tree_hashes(folder):
    """Every file under folder, .git included, by its SHA-256; Python's __pycache__ aside."""
    found = {}
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = os.path.join(top, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return found


def run_lines(out):
    """(run, 'trained' or 'kept') for each run line the command printed."""
    found = re.findall(r"^([AB]\d+ seed \d+): val .*?(trained|kept)[;)]", out, re.MULTILINE)
    return [tuple(match) for match in found]


def compare(repo, *argv, **kwargs):
    return subprocess.run(
        [sys.executable, "compare.py", *argv],
        cwd=repo,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A git repository of this working tree: its main branch as it is, a branch `hack`
    with the edit committed, and main's working tree with the same edit, not committed."""
    repo = str(tmp_path_factory.mktemp("project"))
    arms.copy_working_tree(ROOT, repo)
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["commit", "-q", "-m", "the project"],
        ["checkout", "-q", "-b", "hack"],
    ):
        subprocess.run(GIT + args, cwd=repo, check=True)
    edit(os.path.join(repo, "model.py"), STOCK, HACK)
    subprocess.run(GIT + ["commit", "-q", "-am", "d, not sqrt(d)"], cwd=repo, check=True)
    subprocess.run(GIT + ["checkout", "-q", "main"], cwd=repo, check=True)
    edit(os.path.join(repo, "model.py"), STOCK, HACK)
    return repo


@pytest.fixture(scope="module")
def compared(project, data_root, tmp_path_factory):
    """The command as a new user runs it after the edit (tiny settings): one pair, then two,
    which trains only the second; the tree's files before and after, and the first run's
    records as they were between the two."""
    cache = str(tmp_path_factory.mktemp("cache"))
    argv = [*TINY, f"--data_root={data_root}", f"--out_dir={cache}"]
    before = tree_hashes(project)
    first = compare(project, "--pairs=1", *argv)
    assert first.returncode == 0, first.stderr[-3000:]
    records = {
        key: os.stat(os.path.join(cache, "runs", key, "record.json")).st_mtime_ns
        for key in os.listdir(os.path.join(cache, "runs"))
    }
    done = compare(project, "--pairs=2", *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(cache, "compare.json")) as f:
        report = json.load(f)
    return dict(
        first=first,
        done=done,
        report=report,
        cache=cache,
        argv=argv,
        before=before,
        records=records,
    )


def test_the_users_tree_is_left_byte_for_byte(project, compared):
    assert tree_hashes(project) == compared["before"]
    status = subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True)
    assert status.stdout.decode() == " M model.py\n"


def test_an_edit_to_attention_trains_both_arms_written_out(compared):
    lines = compared["done"].stdout.splitlines()
    assert lines[0].startswith(
        "attention() differs between the arms: both train with --fused=False"
    )
    assert lines[1].startswith("A: HEAD (") and lines[2] == "B: the working tree: model.py changed"
    for arm in ("A", "B"):
        assert compared["report"]["arms"][arm]["argv"].count("--fused=False") == 1
    held = [line for line in lines if line.startswith("held equal: ")]
    assert held == [
        "held equal: 1 thread, dtype float32 (as set), attention written out (attention(), "
        "--fused=False), compile off, device cpu"
    ]


def test_the_report_is_the_runs_paired_t_test(compared):
    report = compared["report"]
    runs = report["runs"]
    a = [pair["A"]["val_loss"] for pair in runs]
    b = [pair["B"]["val_loss"] for pair in runs]
    assert (
        [pair["A"]["seed"] for pair in runs] == [pair["B"]["seed"] for pair in runs] == [1337, 1338]
    )
    # each run's loss is its train.py's whole-val loss, as its log has it
    for pair in runs:
        for arm in ("A", "B"):
            log = os.path.join(compared["cache"], "runs", pair[arm]["key"], "log.jsonl")
            with open(log) as f:
                final = [json.loads(line) for line in f][-1]
            assert final["val_loss_full"] == pair[arm]["val_loss"]
    oracle = stats.ttest_rel(b, a)
    d = report["statistics"]["difference"]
    assert d["p"] == pytest.approx(oracle.pvalue, rel=1e-9)
    assert d["low"] == pytest.approx(oracle.confidence_interval().low, rel=1e-9)
    assert report["statistics"]["params"]["A"] == report["statistics"]["params"]["B"] > 0
    out = compared["done"].stdout
    assert f"verdict: {report['statistics']['verdict']}\n" in out
    assert "ms per iter" in out and "B/A" in out
    with open(os.path.join(compared["cache"], "compare.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_two_runs_of_a_pair_draw_the_same_batches(compared, data_root):
    """Each run's data generator ends as train.py's batch function leaves a generator seeded
    with the pair's seed after the run's iters: the same batches for A and B, others for the
    next pair."""
    report = compared["report"]
    settings = types.SimpleNamespace(**report["arms"]["A"]["probe"]["settings"])
    folder = os.path.join(data_root, "shakespeare_char")
    data = load_split(
        folder, "train", settings.block_size, load_meta(folder)["vocab_size"], torch.device("cpu")
    )
    ends = []
    for pair in report["runs"]:
        gen = torch.Generator().manual_seed(pair["A"]["seed"])
        for _ in range(pair["A"]["iters"]):
            step_batches(data, gen, settings, 0, 1, torch.device("cpu"))
        end = hashlib.sha256(gen.get_state().numpy().tobytes()).hexdigest()[:16]
        assert pair["A"]["data_generator"] == pair["B"]["data_generator"] == end
        ends.append(end)
    assert len(set(ends)) == len(ends)
    assert "batches: the two runs of each pair drew the same batches" in compared["done"].stdout


def test_more_pairs_train_only_the_new_runs(compared):
    """One pair, then two: the second command trains only the second pair, B first (the order
    alternates, so that a drift in the machine's speed favours neither arm)."""
    assert run_lines(compared["first"].stdout) == [
        ("A1 seed 1337", "trained"),
        ("B1 seed 1337", "trained"),
    ]
    assert run_lines(compared["done"].stdout) == [
        ("A1 seed 1337", "kept"),
        ("B1 seed 1337", "kept"),
        ("B2 seed 1338", "trained"),
        ("A2 seed 1338", "trained"),
    ]
    assert "2 runs trained, 2 kept" in compared["done"].stdout
    # the kept runs' folders are as they were, and two new ones are beside them
    runs = os.path.join(compared["cache"], "runs")
    for key, mtime in compared["records"].items():
        assert os.stat(os.path.join(runs, key, "record.json")).st_mtime_ns == mtime
    assert len(os.listdir(runs)) == len(compared["records"]) + 2


def test_ctrl_c_reports_the_pairs_finished(project, compared):
    """Two pairs kept, and Ctrl-C while A3 trains: the report of those two, the unfinished
    run removed, and exit code 0, as train.py's."""
    cache = compared["cache"]
    before = set(os.listdir(os.path.join(cache, "runs")))

    def own_group_with_ctrl_c():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpgrp()  # a terminal's Ctrl-C reaches the whole group: the command and train.py

    child = subprocess.Popen(
        [sys.executable, "compare.py", "--pairs=3", *compared["argv"]],
        cwd=project,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=own_group_with_ctrl_c,
    )
    try:
        deadline = time.time() + 120
        while set(os.listdir(os.path.join(cache, "runs"))) == before and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err[-3000:]
    kept = [("A1 seed 1337", "kept"), ("B1 seed 1337", "kept")]
    assert run_lines(out) == [*kept, ("B2 seed 1338", "kept"), ("A2 seed 1338", "kept")]
    assert "stopped by Ctrl-C: 2 of 3 pairs finished" in out
    assert "verdict: " in out and "the same command again trains the pairs not yet finished" in out
    assert "Traceback" not in err
    assert set(os.listdir(os.path.join(cache, "runs"))) == before


# -----------------------------------------------------------------------------
# Bad input: one line each, and nothing lost


def test_no_git_repository_is_one_line(tmp_path, compared):
    plain = str(tmp_path / "plain")
    arms.copy_working_tree(ROOT, plain)
    done = compare(plain, *compared["argv"])
    assert done.returncode == 2
    assert "is not in a git repository: compare.py takes each arm's code from git" in error_line(
        done
    )


def test_a_ref_that_does_not_exist_is_one_line(project, compared):
    done = compare(project, "--ref=no-such-branch", *compared["argv"])
    assert done.returncode == 2
    assert error_line(done).startswith("error: no commit 'no-such-branch' in ")


def test_a_tree_equal_to_the_ref_has_nothing_to_compare(project, compared):
    done = compare(project, "--ref=hack", *compared["argv"])
    assert done.returncode == 2
    line = error_line(done)
    assert line.startswith("error: the working tree's code is the same as hack (")
    assert ": nothing to compare; edit model.py" in line


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--pairs=many"], ["error: pairs expects int (like 4), got 'many'"]),
        # a setting of train.py's: the arm's own code reads it, and says what it says
        (
            ["--max_iter=5"],
            ["error: arm A, HEAD (", "): unknown config key 'max_iter'; did you mean 'max_iters'?"],
        ),
    ],
)
def test_settings_that_do_not_parse_are_one_line(project, compared, argv, said):
    done = compare(project, *compared["argv"], *argv)
    assert done.returncode == 2
    line = error_line(done)
    assert all(part in line for part in said), line


def test_arm_settings_that_do_not_parse_as_a_command_line_are_one_line(capsys):
    import compare

    assert compare.run(["--b=--qk_norm='"]) == 2
    said = capsys.readouterr()
    assert said.err == "error: --b does not parse as a command line (No closing quotation)\n"
    assert said.out == ""


def test_an_arm_that_fails_says_its_last_line_and_the_other_arms_runs_are_kept(project, compared):
    """B diverges at its first seed; A's run of that seed is kept (trained by the fixture)."""
    cache = compared["cache"]
    done = compare(project, "--ref=HEAD", "--b=--learning_rate=1e9", *compared["argv"])
    assert done.returncode == 1
    line = error_line(done)
    # the arm named with its own settings, as in the report's table and figure
    said = "error: arm B, the working tree with '--learning_rate=1e9', failed at seed 1337: "
    assert line.startswith(said + "the loss is nan")
    assert "training diverged; try a lower --learning_rate" in line
    assert f"the runs that finished are kept in {cache}" in line
    assert run_lines(done.stdout) == [("A1 seed 1337", "kept")]
    a1 = compared["report"]["runs"][0]["A"]["key"]
    assert os.path.exists(os.path.join(cache, "runs", a1, "record.json"))


def test_a_virtual_environment_inside_the_tree_is_not_the_projects_code(tmp_path):
    # a new user often makes the venv in the clone, under any name; git may not ignore it
    repo = str(tmp_path)
    subprocess.run(GIT + ["init", "-q"], cwd=repo, check=True)
    files = {
        "model.py": "x = 1\n",
        "new_idea.py": "y = 2\n",
        "myenv/pyvenv.cfg": "home = /usr/bin\n",
        "myenv/lib/python3.11/site-packages/torch/__init__.py": "",
        "tools/env2/pyvenv.cfg": "home = /usr/bin\n",
        "tools/env2/bin/python": "",
        "tools/helper.py": "z = 3\n",
    }
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(repo, path)), exist_ok=True)
        with open(os.path.join(repo, path), "w") as f:
            f.write(text)
    subprocess.run(GIT + ["add", "model.py"], cwd=repo, check=True)
    assert arms.working_files(repo) == ["model.py", "new_idea.py", "tools/helper.py"]
    copy = tmp_path / "copy"
    arms.copy_working_tree(repo, str(copy))
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()) == [
        "model.py",
        "new_idea.py",
        "tools/helper.py",
    ]
