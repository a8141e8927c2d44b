"""The experiments that write the figures and tables in docs/: python -m experiments.NAME."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")  # where each experiment writes its figures by default
