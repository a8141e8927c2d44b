"""Prepare tiny Shakespeare with the gpt2 tokenizer into this folder.

python data/shakespeare/prepare.py [--input PATH]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from data.prepare import shakespeare_main

if __name__ == "__main__":
    shakespeare_main("gpt2")
