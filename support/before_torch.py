"""
Imported first by every entry point, before torch: on a CPU whose flags promise
bfloat16, whether it runs is tried in a child process (once, then cached), and where
oneDNN's AMX kernels would crash, the cap that avoids them is set in the environment,
where oneDNN reads it when torch loads (support/hardware.py, support/bf16_verdict.py).
An import, so that one line does it.
"""

import importlib.util
import sys

from support import hardware

if importlib.util.find_spec("torch") is None:
    sys.exit("error: PyTorch is not installed in this Python: pip install -r requirements.txt")
# where the CPU's flags rule native bfloat16 out, there is nothing to try or fix
if not hardware.bf16_ruled_out():
    from support import bf16_verdict

    bf16_verdict.check_bf16()
