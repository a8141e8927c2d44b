"""The tests marked stock_formula check model.py's attention as it stands: its formula
softmax(Q K^T / sqrt(d)) V with the causal mask, worked numbers, the fused kernel against
attention() as written, the exports that copy it (Hugging Face, TransformerLens), or Part
I's length. An edit to attention() or causal_mask() is meant to change those, so each
failure of one says so, and the run's summary counts them (tests/conftest.py imports
these hooks). What any attention must keep is tests/test_invariants.py's."""

import pytest

MARKER = "stock_formula"
MESSAGE = (
    "this test checks model.py's stock attention (its formula, or a copy of it: the fused "
    "kernel, an export, worked numbers, Part I's length): an edit to attention() or "
    "causal_mask() is expected to fail it. What any attention must keep: "
    "python -m pytest -n 0 tests/test_invariants.py"
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed stock-formula test's report ends with MESSAGE."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker(MARKER) is not None:
        report.sections.append(("an edit to attention()?", MESSAGE))


def pytest_terminal_summary(terminalreporter):
    """One line under the run's summary: how many failures were stock-formula tests."""
    failed = terminalreporter.stats.get("failed", [])
    stock = [report for report in failed if MARKER in report.keywords]
    if stock:
        terminalreporter.write_line(
            f"{len(stock)} of the {len(failed)} failed tests check model.py's stock attention "
            f"(marked {MARKER}): an edit to attention() or causal_mask() is expected to fail "
            "them; python -m pytest -n 0 tests/test_invariants.py checks what any attention "
            "must keep"
        )
