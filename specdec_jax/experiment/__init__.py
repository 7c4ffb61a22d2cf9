"""The experiment: what a run measures, how, and what it writes.

- a run: `settings` (the gin-bound `Settings` every command reads and the run's
  `Experiment`), `measure` (one measured point), `runner` (a run over a grid, resumable),
  `suite` (several runs from one gin file), `gin_flags` (where a command parses gin and
  builds the objects it passes down);
- its results: `record` (the `PointRow`), `results_io` (results files, best points),
  `tables`, `figures`, `report` and `alpha_curves` (analysis);
- `targets/`: the target kinds a run measures, their interface and registry.

Nothing is imported here. The examples a run measures on are data:
`specdec_jax.data.prompts`; the timing and the choices made from it are
`specdec_jax.costs`.
"""
