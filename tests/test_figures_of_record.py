"""The figures docs/ ships are replaced only when asked: every experiment and benchmark
writes elsewhere by default, and docs/ only with --out_dir=docs."""

import dataclasses
import importlib
import os
import pkgutil
import subprocess

import pytest

import bench
import experiments
from bench import gpu

# the experiments whose figures and pages are in docs/: each writes into
# out-experiments/NAME/ unless given --out_dir=docs
FIGURE_MAKERS = (
    "bidirectional",
    "bottleneck",
    "induction_experiment",
    "linear_attention",
    "long_context",
    "path_length",
    "shakespeare_induction",
    "why_sqrt_d",
)


def commands(package):
    """The command modules of a package: those with a Settings dataclass."""
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if dataclasses.is_dataclass(getattr(module, "Settings", None)):
            found[info.name] = module.Settings
    return found


def into_docs(settings, root):
    """The options of a Settings class whose default is a path in docs/, read from the
    repository's root, where the commands run."""
    docs = os.path.join(root, "docs")
    inside = []
    for field in dataclasses.fields(settings):
        if not isinstance(field.default, str) or not field.default:
            continue
        path = os.path.normpath(os.path.join(root, field.default))
        if path == docs or path.startswith(docs + os.sep):
            inside.append(field.name)
    return inside


def test_no_command_writes_into_docs_by_default(repo_root):
    found = commands(experiments) | {f"bench.{k}": v for k, v in commands(bench).items()}
    assert set(FIGURE_MAKERS) <= set(found)
    in_docs = {name: into_docs(settings, repo_root) for name, settings in found.items()}
    assert {name: fields for name, fields in in_docs.items() if fields} == {}


@pytest.mark.parametrize("name", FIGURE_MAKERS)
def test_each_figure_maker_writes_into_a_scratch_folder_git_ignores(name, repo_root):
    settings = commands(experiments)[name]()
    assert settings.out_dir == os.path.join("out-experiments", name)
    # real git, on the ignore rules of the checkout: nothing written there is committed
    probe = os.path.join(settings.out_dir, f"{name}.png")
    ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=repo_root)
    assert ignored.returncode == 0


def test_the_gpu_page_goes_to_docs_only_when_asked():
    default = gpu.with_outputs(gpu.Settings())
    assert default.page == os.path.join("out-gpu", "gpu.md")
    assert default.figures == os.path.join("out-gpu", "gpu.json")
    asked = gpu.with_outputs(gpu.Settings(out_dir="docs"))
    assert asked.page == os.path.join("docs", "gpu.md")
    assert asked.figures == os.path.join("docs", "gpu.json")


def test_the_check_finds_a_default_in_docs(repo_root):
    @dataclasses.dataclass
    class Settings:
        out_dir: str = "docs"
        png: str = os.path.join(repo_root, "docs", "picture.png")
        out: str = "out-x/docs"
        name: str = "docs-like"

    assert into_docs(Settings, repo_root) == ["out_dir", "png"]
