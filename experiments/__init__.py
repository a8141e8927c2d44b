"""The experiments that write the figures and tables in docs/: python -m experiments.NAME."""
