"""The attention explorer: its analysis, its server and its page (explore.py starts it)."""
