"""
The code of a comparison's two arms (compare.py): each a snapshot of the project in a folder of
its own, taken from a git ref (git archive) or from the working tree as it is, its tracked files
and the untracked ones git does not ignore (so a new file is in, and outputs, datasets and
checkpoints stay out). The user's tree and repository are only read. Also what tells two
snapshots apart: the hash of their code, and the functions of model.py that only the
written-out attention runs, where an edit changes nothing while the fused kernel trains.
"""

import ast
import hashlib
import os
import shutil
import subprocess
import tarfile

# model.py's functions that --fused=False runs and the fused kernel never calls
WRITTEN_OUT = ("attention", "causal_mask", "visible", "MultiHeadAttention.explicit")


class ArmError(Exception):
    """A repository or ref that cannot give an arm's code; one line saying what to do."""


def git(root, *args):
    """git's output in root, or ArmError with git's own first line."""
    try:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, check=False)
    except FileNotFoundError:
        raise ArmError("compare.py snapshots the code with git, which is not installed") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise ArmError(said[0] if said else f"git {args[0]} failed")
    return done.stdout


def repository(folder):
    """The top folder of the git repository that holds folder."""
    try:
        return git(folder, "rev-parse", "--show-toplevel").decode().strip()
    except ArmError:
        raise ArmError(
            f"{folder} is not in a git repository: compare.py takes each arm's code from git; "
            "run it in a clone of the project (or `git init && git add -A && git commit -m "
            "start` first)"
        ) from None


def commit(root, ref):
    """(full hash, short hash) of the commit ref names."""
    try:
        full = git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").decode().strip()
    except ArmError:
        raise ArmError(
            f"no commit {ref!r} in {root}: pass a commit, branch or tag that "
            "`git log --oneline --all` lists (the default is HEAD)"
        ) from None
    return full, full[:7]


def working_files(root):
    """The working tree's files as git sees them: tracked ones still there, and untracked
    ones not ignored; paths relative to root."""
    listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    paths = sorted({path for path in listed.decode().split("\0") if path})
    # a virtual environment made inside the clone (venv/, .venv/, any name: its
    # pyvenv.cfg says what it is) is not the project's code, though git may not ignore it
    envs = [os.path.dirname(path) for path in paths if os.path.basename(path) == "pyvenv.cfg"]
    envs = tuple(os.path.join(env, "") for env in envs if env)
    return [
        path
        for path in paths
        if not path.startswith(envs) and os.path.lexists(os.path.join(root, path))
    ]


def copy_working_tree(root, dest, skip=None):
    """The working tree's files (working_files) copied into dest, links as links, a
    submodule's folder whole; those under the folder skip (the comparison's own cache,
    where it is inside the tree and not ignored) left out."""
    for path in working_files(root):
        source = os.path.join(root, path)
        if skip is not None and os.path.abspath(source).startswith(os.path.join(skip, "")):
            continue
        target = os.path.join(dest, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)


def extract_commit(root, sha, dest):
    """The files of commit sha written into dest, from `git archive`."""
    archive = subprocess.Popen(
        ["git", "-C", root, "archive", "--format=tar", sha], stdout=subprocess.PIPE
    )
    try:
        with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")  # no path may leave dest
            else:
                tar.extractall(dest)
    finally:
        archive.stdout.close()
        code = archive.wait()
    if code != 0:
        raise ArmError(f"git archive {sha[:7]} failed (exit code {code})")


# files no training run executes: the comparison's own, and the tests. An edit to them
# alone is nothing to compare, and leaves the kept runs valid.
NOT_TRAINING = (
    "compare.py",
    "support/arms.py",
    "support/arm_probe.py",
    "support/compare_runs.py",
    "support/compare_stats.py",
)


def python_files(folder):
    """{path relative to folder: SHA-256 of its bytes} for the snapshot's Python files that
    a training run may execute (all but NOT_TRAINING and tests/)."""
    found = {}
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = os.path.join(top, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            skipped = relative in NOT_TRAINING or relative.split("/")[0] == "tests"
            if name.endswith(".py") and not skipped:
                with open(path, "rb") as f:
                    found[relative] = hashlib.sha256(f.read()).hexdigest()
    return found


def code_hash(files):
    """The hash of a snapshot's code, from python_files: its Python files' paths and
    contents. Other files (docs, pictures) change no run."""
    text = "".join(f"{path}\0{digest}\n" for path, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def changed(files_a, files_b):
    """The Python files that differ between two snapshots: changed, added or removed."""
    return sorted(p for p in set(files_a) | set(files_b) if files_a.get(p) != files_b.get(p))


def without_docstring(node):
    """The function node's body less its docstring: a comment or docstring edit is no edit."""
    body = node.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def written_out_functions(folder):
    """{name: its code} for WRITTEN_OUT in folder's model.py (None: not found there); None
    where model.py does not parse (its arm's check says so)."""
    try:
        with open(os.path.join(folder, "model.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    found = dict.fromkeys(WRITTEN_OUT)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in found:
            found[node.name] = without_docstring(node)
        if isinstance(node, ast.ClassDef):
            for inner in node.body:
                name = f"{node.name}.{inner.name}" if hasattr(inner, "name") else None
                if isinstance(inner, ast.FunctionDef) and name in found:
                    found[name] = without_docstring(inner)
    return found


def written_out_edits(folder_a, folder_b):
    """The WRITTEN_OUT functions whose code differs between the two snapshots."""
    a = written_out_functions(folder_a)
    b = written_out_functions(folder_b)
    if a is None or b is None:
        return []
    return [name for name in WRITTEN_OUT if a[name] != b[name]]
