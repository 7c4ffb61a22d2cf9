"""Drafts priced by the speedup their alpha and c predict under the cost model.

`draft_ranking` ranks trained drafts (`python -m benchmarks draft_speedups`), `draft_heads`
sweeps a draft's shortlist output layer (`python -m benchmarks draft_heads`).
"""
