"""docs/lectures.md points only at things that exist: every `file:name` is defined in its
file, every `tests/...::test_name` is a test function, every linked page or figure is a
file in docs/, every row of its tables names code and a test, and a weight matrix a claim
names (W_Q, W_K, W_V, W_O) is named by every file and page the claim points at."""

import ast
import os
import re

import pytest

CODE = re.compile(r"`([\w/]+\.py):([\w.]+)`")
TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
LINK = re.compile(r"\]\(([\w./-]+)\)")
MATRIX = re.compile(r"\bW_[QKVO]\b")


def rows(repo_root):
    """The table rows of docs/lectures.md, header and rule lines left out."""
    with open(os.path.join(repo_root, "docs", "lectures.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    table = [line for line in lines if line.startswith("|")]
    return [line for line in table if not line.startswith(("| lectures", "|---"))]


def defined_names(path):
    """Top-level functions, classes and assigned names of a Python file, and Class.method."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(f"{node.name}.{item.name}")
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_the_page_has_rows(repo_root):
    assert len(rows(repo_root)) >= 30


def test_every_row_names_code_and_a_test(repo_root):
    for row in rows(repo_root):
        assert CODE.search(row), f"no file:name in: {row[:80]}"
        assert TEST.search(row), f"no test in: {row[:80]}"


def undefined(repo_root, pattern, separator):
    """Every `path<separator>name` the rows name by pattern whose file does not define it."""
    missing = []
    for row in rows(repo_root):
        for path, name in pattern.findall(row):
            full = os.path.join(repo_root, path)
            if not os.path.isfile(full) or name not in defined_names(full):
                missing.append(f"{path}{separator}{name}")
    return missing


def test_every_file_name_exists(repo_root):
    assert not undefined(repo_root, CODE, ":")


def test_every_test_named_exists(repo_root):
    assert not undefined(repo_root, TEST, "::")


def test_every_linked_page_and_figure_exists(repo_root):
    with open(os.path.join(repo_root, "docs", "lectures.md"), encoding="utf-8") as f:
        links = LINK.findall(f.read())
    assert links
    missing = [link for link in links if not os.path.isfile(os.path.join(repo_root, "docs", link))]
    assert not missing


def unnamed_matrices(row, repo_root):
    """`path: W_X` for each weight matrix the row's claim names that a code file or a
    linked page of the row never names."""
    claim = row.strip().strip("|").split(" | ")[1]
    matrices = sorted(set(MATRIX.findall(claim)))
    paths = [path for path, _ in CODE.findall(row)]
    paths += [os.path.join("docs", link) for link in LINK.findall(row) if link.endswith(".md")]
    missing = []
    for path in sorted(set(paths)):
        with open(os.path.join(repo_root, path), encoding="utf-8") as f:
            named = set(MATRIX.findall(f.read()))
        missing += [f"{path}: {m}" for m in matrices if m not in named]
    return missing


def test_every_weight_matrix_a_claim_names_is_named_where_it_points(repo_root):
    """The queries, keys and values claim pointed at a page that never named W_Q."""
    checked = [row for row in rows(repo_root) if MATRIX.search(row)]
    assert len(checked) >= 2
    assert [miss for row in checked for miss in unnamed_matrices(row, repo_root)] == []


def test_a_claim_pointing_at_a_page_without_its_matrices_is_found(repo_root):
    row = "| 000 | `Q = X W_Q`, then W_O | `model.py:Head` | `tests/x.py::t` | [data.md](data.md) |"
    assert unnamed_matrices(row, repo_root) == ["docs/data.md: W_O", "docs/data.md: W_Q"]


@pytest.mark.parametrize("text", ["`model.py:nothing_here`", "`tests/test_model.py::test_nothing`"])
def test_the_checks_can_fail(repo_root, text):
    """A made-up name is not found by the same lookups."""
    code = CODE.findall(text)
    tests = TEST.findall(text)
    for path, name in code + tests:
        assert name not in defined_names(os.path.join(repo_root, path))
