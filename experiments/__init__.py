"""Entry points: measurement runs, training, analysis, benchmarks."""
