"""Drafts priced by the speedup their alpha and c predict under the cost model.

`draft_ranking` ranks drafts of any family against their target, `t5_runs` the T5 family's
trained drafts through it (`python -m benchmarks draft_speedups`), `draft_heads`
sweeps a draft's shortlist output layer (`python -m benchmarks draft_heads`).
"""
