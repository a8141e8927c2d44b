"""
How dense a model file reads, measured the same way for any file: a markdown table.

    python -m experiments.readability model.py path/to/nanogpt/model.py

The columns, one row per file:

- lines: all lines of the file, blank ones and comments included.
- chars per non-blank line: the characters of the non-blank lines (indentation included,
  trailing whitespace not), divided by their number.
- operations per code line: the operations, counted as the ast nodes of the kinds in
  OPERATIONS (calls, binary and unary operators, and/or, comparisons, subscripts,
  conditional expressions, lambdas, comprehension clauses), divided by the code lines:
  the lines holding a token that is not a comment, part of a docstring or whitespace.
- lines > 100 chars: lines longer than 100 characters.
- tuple-to-tuple `a, b = x, y`: assignments of a tuple of values to a tuple of targets.
- inline `x if c else y`: conditional expressions, anywhere in the file.
- attention `forward`: branch points: the McCabe count of MultiHeadAttention.forward (or
  nanoGPT's CausalSelfAttention.forward): 1, plus one per if, elif, for, while,
  comprehension clause and conditional expression, plus one per `and` or `or`.
"""

import ast
import io
import sys
import tokenize

OPERATIONS = (
    ast.Call,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.Subscript,
    ast.IfExp,
    ast.Lambda,
    ast.comprehension,
)
ATTENTION_CLASSES = ("MultiHeadAttention", "CausalSelfAttention")
NOT_CODE = (
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
)
COLUMNS = (
    "model file",
    "lines",
    "chars per non-blank line",
    "operations per code line",
    "lines > 100 chars",
    "tuple-to-tuple `a, b = x, y`",
    "inline `x if c else y`",
    "attention `forward`: branch points",
)


def docstring_lines(tree):
    """The line numbers of every module, class and function docstring."""
    lines = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not node.body:
            continue
        first = node.body[0]
        is_string = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if is_string and isinstance(first.value.value, str):
            lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source, tree):
    """The line numbers holding code: a token other than a comment, outside docstrings."""
    docstrings = docstring_lines(tree)
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in NOT_CODE:
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def branch_points(function):
    """McCabe's count for one function: 1 plus its decisions."""
    count = 1
    for node in ast.walk(function):
        if isinstance(node, (ast.If, ast.For, ast.While, ast.IfExp, ast.comprehension)):
            count += 1
        if isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
    return count


def attention_forward(tree):
    """The attention class's forward, or None where the file has none."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in ATTENTION_CLASSES:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return item
    return None


def is_tuple_to_tuple(node):
    if not isinstance(node, ast.Assign):
        return False
    return isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple)


def measure(source):
    """The table's numbers for one file's source, in COLUMNS' order after the name."""
    tree = ast.parse(source)
    lines = source.splitlines()
    non_blank = [line.rstrip() for line in lines if line.strip()]
    nodes = list(ast.walk(tree))
    operations = sum(isinstance(node, OPERATIONS) for node in nodes)
    forward = attention_forward(tree)
    branches = "-"
    if forward is not None:
        branches = branch_points(forward)
    return (
        len(lines),
        round(sum(len(line) for line in non_blank) / max(1, len(non_blank)), 1),
        round(operations / max(1, len(code_lines(source, tree))), 2),
        sum(len(line) > 100 for line in lines),
        sum(is_tuple_to_tuple(node) for node in nodes),
        sum(isinstance(node, ast.IfExp) for node in nodes),
        branches,
    )


def table(rows):
    """A markdown table of (name, numbers) rows."""
    out = ["| " + " | ".join(COLUMNS) + " |"]
    out.append("|" + "---|" * len(COLUMNS))
    for name, numbers in rows:
        out.append("| " + " | ".join([name] + [str(n) for n in numbers]) + " |")
    return "\n".join(out)


def read(path):
    """A file's source, or one line saying what is wrong, and exit."""
    try:
        with open(path) as f:
            source = f.read()
        ast.parse(source)
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: cannot read {path} ({type(e).__name__}); give the path of a .py file")
    except SyntaxError as e:
        sys.exit(f"error: {path} is not Python this interpreter parses (line {e.lineno})")
    return source


def main(paths):
    if not paths or any(p in ("-h", "--help") for p in paths):
        print(__doc__.strip())
        return
    rows = [(path, measure(read(path))) for path in paths]
    print(table(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
