"""Prepare tiny Shakespeare with the char tokenizer into this folder.

python data/shakespeare_char/prepare.py [--input PATH]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from data.prepare import shakespeare_main

if __name__ == "__main__":
    shakespeare_main("char")
