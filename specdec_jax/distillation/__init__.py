"""Distillation data made by the target, computed once and stored (no TensorFlow).

`teacher` (the target loaded and identified, its vocabulary checked, a directory lock),
`decode` (its outputs on every training input: `python -m experiments.distill_data`),
`signals` (its top-k log-probabilities along those outputs and its encoder outputs:
`python -m experiments.teacher_signals`). The on-disk formats and readers are the data
layer's: `specdec_jax.data.distill`, `specdec_jax.data.teacher_signals`.
"""
