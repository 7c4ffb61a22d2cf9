"""The experiment library behind the commands in `experiments/`.

One module per job: `settings` (the gin-bound `Settings` every command reads and
the run's `Experiment`), `measure` (one measured point), `runner` (a run over a
grid, resumable), `results_io` (results files, row keys, best points), `tables`,
`figures` and `report` (analysis), `family` and `stand_ins` (the model family), `gin_flags`, `train`
(the training driver), `alpha_tracking` and `alpha_curves` (alpha during training),
`draft_ranking` (trained drafts by predicted speedup), `regime_map`, `regime_predictions`
and `regime_figure` (the public T5 shapes' costs measured here, priced with published
alpha) and `accelerator_checks` (the device check's own: jax#40101's writes, a step at a
long cache). The statistics and the timing code every command shares are core modules:
`specdec_jax.stats` and `specdec_jax.benchmarking`.

Nothing is imported here. The device check needs gin-config and tqdm beside jax, flax,
numpy, safetensors and sentencepiece, but no seqio, TensorFlow or torch. The examples a
run measures on are data: `specdec_jax.data.prompts`.
"""
