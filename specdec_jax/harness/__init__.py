"""The experiment library behind the commands in `experiments/`.

One module per job:
- a run: `settings` (the gin-bound `Settings` every command reads and the run's
  `Experiment`), `registry` (the target kinds and their checks), `targets` (the
  interface a kind implements), `t5_target` and `llama_target` (the two kinds),
  `measure` (one measured point), `runner` (a run over a grid, resumable), `suite`
  (several runs from one gin file), `gin_flags`;
- its results: `record` (the `PointRow`), `results_io` (results files, best points),
  `tables`, `figures` and `report` (analysis);
- the model family: `family` and `stand_ins`; training: `train` (T5 and the
  shared-encoder drafts), `train_student` (a decoder-only draft on a GGUF target's
  signals), `alpha_tracking` and `alpha_curves` (alpha during training), `draft_heads`
  and `draft_ranking` (drafts by shortlist size and by predicted speedup);
- the T5 regime map: `regime_map`, `regime_rows`, `regime_predictions`, `regime_figure`;
- `accelerator_checks` (the device check's own: jax#40101's writes, a step at a long
  cache).

The statistics and the timing code every command shares are core modules:
`specdec_jax.stats` and `specdec_jax.benchmarking`.

Nothing is imported here. The device check needs gin-config and tqdm beside jax, flax,
numpy, safetensors and sentencepiece, but no seqio, TensorFlow or torch. The examples a
run measures on are data: `specdec_jax.data.prompts`.
"""
