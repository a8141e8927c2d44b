"""
Imported first by every entry point, before torch: whether bfloat16 runs on this
CPU is tried in a child process, and where oneDNN's AMX kernels would crash, the
cap that avoids them is set in the environment, where oneDNN reads it when torch
loads (support/hardware.py). An import, so that one line does it.
"""

import importlib.util
import sys

from support import hardware

if importlib.util.find_spec("torch") is None:
    sys.exit("error: PyTorch is not installed in this Python: pip install -r requirements.txt")
hardware.check_bf16()
