"""The commands a user runs, each `python -m experiments.NAME` (benchmarks: `benchmarks/`)."""
